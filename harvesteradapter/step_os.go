package harvesteradapter

import (
	"context"
	"fmt"
	"time"

	sucv1 "github.com/rancher/system-upgrade-controller/pkg/apis/upgrade.cattle.io/v1"
	corev1 "k8s.io/api/core/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	harvesterv1 "github.com/capi-inplace/capi-inplace/harvesteradapter/api/v1alpha1"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/internal/kube"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/releases"
	"github.com/capi-inplace/capi-inplace/harvesteradapter/suc"
)

// osStep is Harvester's post-drain on the node (upgrade_node.sh command_post_drain): it
// removes RKE2's archives, writes the release's post-drain settings, installs the
// release's operating system and waits for the node to come back Ready on it after its
// reboot. With upgradeOS false it does all but the install: the release runs the
// settings and the archive cleanup whether or not upgrade_os installs anything.
var osStep = step{
	name:    StepOSUpgrade,
	timeout: func(t harvesterv1.Timeouts) time.Duration { return suc.PlanTimeout(suc.PlanOS, t) },
	run:     (*Updater).runOS,
}

func (u *Updater) runOS(ctx context.Context, r *nodeRun) (bool, string, error) {
	done, message, err := u.applyPlan(ctx, r, suc.PlanOS)
	if err != nil || !done {
		return done, message, err
	}
	node, err := u.node(ctx, r)
	if err != nil {
		return false, "", err
	}
	if !releases.UpgradesOS(r.cfg) {
		return true, fmt.Sprintf("upgradeOS is false in the HarvesterUpgrader: RKE2's archives removed and the release's post-drain settings written on node %s (they take effect at RKE2's next start); its OS stays %s",
			node.Name, node.Status.NodeInfo.OSImage), nil
	}
	want := "Harvester " + r.cfg.Spec.Release.Version
	if !kube.NodeReady(node) || !releases.OSAtRelease(node.Status.NodeInfo.OSImage, r.cfg.Spec.Release.Version) {
		return false, fmt.Sprintf("waiting for node %s to come back Ready on %s after its reboot (it reports %q)", node.Name, want, node.Status.NodeInfo.OSImage), nil
	}
	return true, fmt.Sprintf("node %s runs %s", node.Name, want), nil
}

// rebootHold says, once an ending has waited RebootWait from its start for the reboot
// the node's OS upgrade armed, why the node is held: the ending then goes on and leaves
// the node cordoned (cleanup), since the reboot may still come (a timer that fires late,
// a node down that comes back) and the node must not take workloads before. A reboot
// that never comes is what real upgrades met: nodes left unrebooted after their
// upgrade's node Job (harvester/harvester#6022, #7457), a server that never came back
// from it (#10048). "" while the ending still waits.
func (u *Updater) rebootHold(ctx context.Context, r *nodeRun) string {
	wait := u.RebootWait
	if wait == 0 {
		wait = 15 * time.Minute
	}
	start := r.nu.Status.AbortStartTime
	if start == nil || time.Since(start.Time) < wait {
		return ""
	}
	node := &corev1.Node{}
	state := "gone"
	if err := r.wc.Get(ctx, client.ObjectKey{Name: r.nu.Spec.NodeName}, node); err == nil {
		state = fmt.Sprintf("Ready %t, boot %s, %s", kube.NodeReady(node), node.Status.NodeInfo.BootID, node.Status.NodeInfo.OSImage)
	}
	return fmt.Sprintf("the reboot that NodeUpdate %s's OS upgrade armed on node %s has not come within %s of the update's ending (the node: %s); the node stays cordoned, since the reboot may still come. "+
		"Check the node (systemctl list-timers capi-inplace-reboot; uptime): reboot it by hand, or uncordon it (kubectl uncordon %s) once it will not reboot; a next NodeUpdate of the node schedules the reboot again",
		r.nu.Name, r.nu.Spec.NodeName, wait, state, r.nu.Spec.NodeName)
}

// rebootPending tells whether the reboot the node's os Plan armed is still to come or
// under way, so that no ending of the NodeUpdate (abort, failure, timeout, deletion)
// comes before it. os-upgrade arms the reboot on the host and exits; its Job completes
// before the host goes down (harvester-node-upgrade.md fact 28), and nothing in the
// cluster can take the armed reboot back. So once the os Plan's Job succeeded on the
// node, the node is taken as rebooting until its kubelet reports Ready on a boot other
// than the one the Plan recorded at its creation (AnnotationBootID), or on the release's
// OS (then nothing was installed, or the node booted it: os-upgrade arms no reboot on a
// node that runs the release's OS). A node whose os Plan recorded no boot ID (created
// by an earlier manager) is waited for until it runs the release's OS.
func (u *Updater) rebootPending(ctx context.Context, r *nodeRun, plans []sucv1.Plan) (bool, error) {
	if !releases.UpgradesOS(r.cfg) {
		return false, nil // the os Plan installs nothing and arms no reboot
	}
	name := suc.PlanName(suc.PlanOS, r.nu)
	var osPlan *sucv1.Plan
	for i := range plans {
		if plans[i].Name == name {
			osPlan = &plans[i]
		}
	}
	if osPlan == nil {
		return false, nil
	}
	node, err := u.node(ctx, r)
	if err != nil {
		return false, err
	}
	succeeded := osPlan.Status.LatestHash != "" && suc.DoneOn(osPlan, node)
	if !succeeded {
		if succeeded, err = suc.JobSucceeded(ctx, r.wc, osPlan, node.Name); err != nil {
			return false, err
		}
	}
	if !succeeded {
		return false, nil
	}
	booted := osPlan.Annotations[suc.AnnotationBootID]
	newBoot := booted != "" && node.Status.NodeInfo.BootID != booted
	if kube.NodeReady(node) && (newBoot || releases.OSAtRelease(node.Status.NodeInfo.OSImage, r.cfg.Spec.Release.Version)) {
		return false, nil
	}
	ctrl.LoggerFrom(ctx).Info("Waiting for the node's reboot, armed by its OS upgrade, before ending", "node", node.Name,
		"plan", osPlan.Name, "bootID", node.Status.NodeInfo.BootID, "ready", kube.NodeReady(node), "osImage", node.Status.NodeInfo.OSImage)
	return true, nil
}
