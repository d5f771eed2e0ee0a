package upgradetask

import (
	"github.com/prometheus/client_golang/prometheus"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/internal/metricsreg"
)

// Metrics are the UpgradeTask controller's Prometheus metrics.
type Metrics struct {
	// taskPhase is 1 for the phase each task is in (sum by phase: tasks by phase).
	taskPhase *prometheus.GaugeVec
	// machines counts each task's machines by state (waiting, in_progress, failed, upgraded).
	machines *prometheus.GaugeVec
	// nodeDuration is how long one node's upgrade took, by result.
	nodeDuration *prometheus.HistogramVec
}

var allPhases = []inplacev1.TaskPhase{
	inplacev1.TaskPhasePending, inplacev1.TaskPhaseInProgress, inplacev1.TaskPhaseCompleted, inplacev1.TaskPhaseFailed,
	inplacev1.TaskPhaseAborting, inplacev1.TaskPhaseAborted, inplacev1.TaskPhasePlanned,
}

// NewMetrics creates the metrics and registers them with reg (controller-runtime's
// registry when nil). Registering twice (several managers in one process, as in tests)
// reuses the collectors already registered.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	if reg == nil {
		reg = ctrlmetrics.Registry
	}
	m := &Metrics{
		taskPhase: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "capi_inplace_upgradetask_phase",
			Help: "1 for the phase an UpgradeTask is in; sum by phase for the number of tasks by phase.",
		}, []string{"namespace", "name", "phase"}),
		machines: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "capi_inplace_upgradetask_machines",
			Help: "Machines of an UpgradeTask by state: waiting, in_progress, failed, upgraded.",
		}, []string{"namespace", "name", "state"}),
		nodeDuration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "capi_inplace_upgradetask_node_duration_seconds",
			Help:    "Time from the start of a node's NodeUpdate to its end, by result.",
			Buckets: prometheus.ExponentialBuckets(30, 2, 10),
		}, []string{"result"}),
	}
	m.taskPhase = metricsreg.Register(reg, m.taskPhase)
	m.machines = metricsreg.Register(reg, m.machines)
	m.nodeDuration = metricsreg.Register(reg, m.nodeDuration)
	return m
}

func (m *Metrics) observeTask(task *inplacev1.UpgradeTask) {
	if m == nil {
		return
	}
	for _, p := range allPhases {
		v := 0.0
		if task.Status.Phase == p {
			v = 1
		}
		m.taskPhase.WithLabelValues(task.Namespace, task.Name, string(p)).Set(v)
	}
	m.machines.WithLabelValues(task.Namespace, task.Name, "waiting").Set(float64(task.Status.Waiting))
	m.machines.WithLabelValues(task.Namespace, task.Name, "in_progress").Set(float64(task.Status.InProgress))
	m.machines.WithLabelValues(task.Namespace, task.Name, "failed").Set(float64(task.Status.Failed))
	m.machines.WithLabelValues(task.Namespace, task.Name, "upgraded").Set(float64(task.Status.Upgraded))
}

func (m *Metrics) observeNode(_ *inplacev1.UpgradeTask, ms inplacev1.MachineUpgradeStatus, result string) {
	if m == nil || ms.StartTime == nil || ms.CompletionTime == nil {
		return
	}
	m.nodeDuration.WithLabelValues(result).Observe(ms.CompletionTime.Sub(ms.StartTime.Time).Seconds())
}

func (m *Metrics) forgetTask(namespace, name string) {
	if m == nil {
		return
	}
	m.taskPhase.DeletePartialMatch(prometheus.Labels{"namespace": namespace, "name": name})
	m.machines.DeletePartialMatch(prometheus.Labels{"namespace": namespace, "name": name})
}
