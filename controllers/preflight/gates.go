package preflight

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

// GateResult is the outcome of a task-level gate: when closed, no node is started.
type GateResult struct {
	// Name names the gate, for example Window.
	Name string
	// Open is true when the gate lets nodes start.
	Open bool
	// Reason is the Paused condition reason when closed (PausedByUser, OutsideWindow, Soaking).
	Reason string
	// Message says why the gate is closed and until when, when known.
	Message string
	// RetryAfter is when the gate may open by itself; zero when only a change of spec opens it.
	RetryAfter time.Duration
}

// GateInput is what the gates look at.
type GateInput struct {
	// Spec is the task's spec.
	Spec *inplacev1.UpgradeTaskSpec
	// Now is the current time, from the controller's clock.
	Now time.Time
	// LastNodeCompletion is when the last node of the task ended; zero when none has.
	LastNodeCompletion time.Time
	// HeldBy names an older live task of the same target that this task waits for.
	HeldBy string
	// ControlPlaneBehind describes, for a MachineDeployment's task, the control plane
	// machines that do not run the target yet.
	ControlPlaneBehind []string
	// FailureBudgetExhausted, when set, says that the Cluster's failure budget is
	// exhausted: which nodes failed and how to lift it.
	FailureBudgetExhausted string
	// Health are the health gates' last results (spec.gates and the Cluster's).
	Health []HealthGate
	// DrainPolicyProblem, when set, says why the Cluster's drain-policy annotation
	// cannot be used: no node starts under a policy other than the one asked.
	DrainPolicyProblem string
}

// Gate names.
const (
	DuplicateGateName   = "DuplicateTask"
	VersionSkewGateName = "VersionSkew"
	PausedGateName      = "Paused"
	WindowGateName      = "Window"
	SoakGateName        = "PostNodeDelay"
	HealthGateName      = "HealthGates"
	DrainPolicyGateName = "DrainPolicy"
)

// Gates evaluates, in order, the Cluster's failure budget, an older task of the same
// target, the control plane's version, spec.paused, the maintenance window, the health
// gates and the soak delay, and returns the first that is closed, or an open result when
// all let nodes start.
func Gates(in GateInput) GateResult {
	for _, g := range []func(GateInput) GateResult{failureBudgetGate, drainPolicyGate, duplicateGate, versionSkewGate, pausedGate, windowGate, healthGate, soakGate} {
		if r := g(in); !r.Open {
			return r
		}
	}
	return GateResult{Open: true}
}

// drainPolicyGate keeps a task from starting nodes while the Cluster's drain-policy
// annotation, which its NodeUpdates would carry, cannot be used.
func drainPolicyGate(in GateInput) GateResult {
	if in.DrainPolicyProblem == "" {
		return GateResult{Name: DrainPolicyGateName, Open: true}
	}
	return GateResult{Name: DrainPolicyGateName, Reason: inplacev1.InvalidDrainPolicyReason, Message: in.DrainPolicyProblem}
}

// duplicateGate keeps a task from starting nodes while an older live task of the same
// target runs: one live task per target, whichever path created them.
func duplicateGate(in GateInput) GateResult {
	if in.HeldBy == "" {
		return GateResult{Name: DuplicateGateName, Open: true}
	}
	return GateResult{Name: DuplicateGateName, Reason: inplacev1.DuplicateTaskReason,
		Message: fmt.Sprintf("UpgradeTask %s of the same target has not ended; this task starts no node until it has (abort or delete one of them)", in.HeldBy)}
}

// versionSkewGate keeps a MachineDeployment's task from starting nodes while its control
// plane runs an older version than the target: a kubelet must never be newer than the
// API server it talks to.
func versionSkewGate(in GateInput) GateResult {
	if len(in.ControlPlaneBehind) == 0 {
		return GateResult{Name: VersionSkewGateName, Open: true}
	}
	return GateResult{Name: VersionSkewGateName, Reason: inplacev1.VersionSkewReason,
		Message: fmt.Sprintf("the control plane is not at %s yet (%s); workers wait so that no kubelet is newer than the API server",
			in.Spec.Version, joinLimited(in.ControlPlaneBehind, 5))}
}

func pausedGate(in GateInput) GateResult {
	if in.Spec.Paused {
		return GateResult{Name: PausedGateName, Reason: inplacev1.PausedByUserReason,
			Message: "spec.paused is true: no new node is started; nodes in progress finish"}
	}
	return GateResult{Name: PausedGateName, Open: true}
}

func windowGate(in GateInput) GateResult {
	w := in.Spec.Window
	if w == nil {
		return GateResult{Name: WindowGateName, Open: true}
	}
	open, next, err := WindowOpen(w, in.Now)
	if err != nil {
		return GateResult{Name: WindowGateName, Reason: inplacev1.OutsideWindowReason, Message: fmt.Sprintf("spec.window is not usable: %v", err)}
	}
	if open {
		return GateResult{Name: WindowGateName, Open: true}
	}
	return GateResult{Name: WindowGateName, Reason: inplacev1.OutsideWindowReason,
		Message:    fmt.Sprintf("outside the maintenance window %s; it opens next at %s", describeWindow(w), next.Format(time.RFC3339)),
		RetryAfter: next.Sub(in.Now)}
}

func soakGate(in GateInput) GateResult {
	d := in.Spec.PostNodeDelay
	if d == nil || d.Duration <= 0 || in.LastNodeCompletion.IsZero() {
		return GateResult{Name: SoakGateName, Open: true}
	}
	until := in.LastNodeCompletion.Add(d.Duration)
	if !in.Now.Before(until) {
		return GateResult{Name: SoakGateName, Open: true}
	}
	return GateResult{Name: SoakGateName, Reason: inplacev1.SoakingReason,
		Message:    fmt.Sprintf("soaking for spec.postNodeDelay %s after the last node; next node not before %s", d.Duration, until.UTC().Format(time.RFC3339)),
		RetryAfter: until.Sub(in.Now)}
}

// WindowOpen reports whether the maintenance window is open at now and, when it is
// closed, when it opens next. Days name the day the window opens on; a window whose end
// is before its start runs past midnight into the next day.
func WindowOpen(w *inplacev1.MaintenanceWindow, now time.Time) (open bool, nextOpen time.Time, err error) {
	tz := w.TimeZone
	if tz == "" {
		tz = "UTC"
	}
	loc, err := time.LoadLocation(tz)
	if err != nil {
		return false, time.Time{}, fmt.Errorf("time zone %q: %w", tz, err)
	}
	start, err := minuteOfDay(w.Start)
	if err != nil {
		return false, time.Time{}, fmt.Errorf("start: %w", err)
	}
	end, err := minuteOfDay(w.End)
	if err != nil {
		return false, time.Time{}, fmt.Errorf("end: %w", err)
	}
	length := end - start
	if length <= 0 {
		length += 24 * 60
	}
	local := now.In(loc)
	dayOK := func(d time.Time) bool {
		return len(w.Days) == 0 || slices.Contains(w.Days, inplacev1.Weekday(d.Weekday().String()))
	}
	// The window opened today or yesterday (when it runs past midnight) may hold now;
	// otherwise the next opening is within the coming eight days.
	midnight := time.Date(local.Year(), local.Month(), local.Day(), 0, 0, 0, 0, loc)
	for offset := -1; offset <= 8; offset++ {
		day := midnight.AddDate(0, 0, offset)
		opens := time.Date(day.Year(), day.Month(), day.Day(), start/60, start%60, 0, 0, loc)
		closes := opens.Add(time.Duration(length) * time.Minute)
		if !dayOK(day) {
			continue
		}
		if !local.Before(opens) && local.Before(closes) {
			return true, time.Time{}, nil
		}
		if opens.After(local) {
			return false, opens, nil
		}
	}
	return false, time.Time{}, fmt.Errorf("no opening within the next week")
}

func minuteOfDay(hhmm string) (int, error) {
	h, m, ok := strings.Cut(hhmm, ":")
	if !ok {
		return 0, fmt.Errorf("%q is not HH:MM", hhmm)
	}
	hours, err1 := strconv.Atoi(h)
	minutes, err2 := strconv.Atoi(m)
	if err1 != nil || err2 != nil || hours < 0 || hours > 23 || minutes < 0 || minutes > 59 {
		return 0, fmt.Errorf("%q is not a time of day HH:MM", hhmm)
	}
	return hours*60 + minutes, nil
}

func describeWindow(w *inplacev1.MaintenanceWindow) string {
	days := "every day"
	if len(w.Days) > 0 {
		parts := make([]string, 0, len(w.Days))
		for _, d := range w.Days {
			parts = append(parts, string(d))
		}
		days = strings.Join(parts, ",")
	}
	tz := w.TimeZone
	if tz == "" {
		tz = "UTC"
	}
	return fmt.Sprintf("%s-%s %s (%s)", w.Start, w.End, tz, days)
}
