package nodeprogram

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// The RKE2 and kubelet settings every Harvester release writes on a node during its
// upgrade (shared/facts/harvester-release-steps.md facts 49 and 51; harvester-node-upgrade.md
// facts 24.7, 24.8 and 26.2), each a small named unit that runs at the point of the
// node's upgrade where the release runs it. Their source is Harvester's
// package/upgrade/upgrade_node.sh, the same at v1.7.1, v1.7.3, v1.8.2 and v1.9.0-rc6
// (the releases of the supported hops): command_pre_drain and command_post_drain.
const (
	rke2ConfigDir = "/etc/rancher/rke2/config.yaml.d"
	// canalConfigManifest is a leftover of old installs (harvester commit 380ddce).
	canalConfigManifest = rke2ManifestsDir + "/rke2-canal-config.yaml"
	disableChartsFile   = rke2ConfigDir + "/40-disable-charts.yaml"
	maxPodsFile         = rke2ConfigDir + "/99-max-pods.yaml"
	reservedFile        = rke2ConfigDir + "/99-z00-harvester-reserved-resources.yaml"
	cdiFile             = rke2ConfigDir + "/91-harvester-cdi.yaml"
	cleanupKubeletFile  = "/oem/91_cleanup_kubelet.yaml"

	// harvesterMaxPods is the release's MAX_PODS.
	harvesterMaxPods = 200
)

// rke2SettingsStage is where in a node's upgrade a unit runs.
type rke2SettingsStage string

const (
	// stagePreDrain: after the node's VMs are out, before its RKE2 restarts at the release
	// (Harvester's pre-drain). What it writes takes effect at that restart.
	stagePreDrain rke2SettingsStage = "pre-drain"
	// stagePostDrain: after the node's RKE2 runs the release, before its OS upgrade
	// (Harvester's post-drain). What it writes takes effect at the next RKE2 start: the
	// OS upgrade's reboot.
	stagePostDrain rke2SettingsStage = "post-drain"
)

// rke2SettingsUnit is one setting of the release on a node: its name (the function of
// upgrade_node.sh it does), its stage, and what it does to the host.
type rke2SettingsUnit struct {
	name  string
	stage rke2SettingsStage
	apply func(ctx context.Context, env *Env) (string, error)
}

func rke2SettingsUnits() []rke2SettingsUnit {
	return []rke2SettingsUnit{
		// upgrade_node.sh remove_rke2_canal_config (fact 49).
		{name: "remove_rke2_canal_config", stage: stagePreDrain, apply: removeCanalConfig},
		// upgrade_node.sh disable_rke2_charts (fact 49): Harvester manages the snapshot
		// controller charts RKE2 enables by default since v1.25.7.
		{name: "disable_rke2_charts", stage: stagePreDrain, apply: writeAlways(disableChartsFile,
			"disable:\n- rke2-snapshot-controller\n- rke2-snapshot-controller-crd\n- rke2-snapshot-validation-webhook\n")},
		// upgrade_node.sh set_max_pods (fact 51): always overwritten.
		{name: "set_max_pods", stage: stagePostDrain, apply: writeAlways(maxPodsFile,
			fmt.Sprintf("kubelet-arg:\n- \"max-pods=%d\"\n", harvesterMaxPods))},
		// upgrade_node.sh set_reserved_resource (fact 51): only if absent.
		{name: "set_reserved_resource", stage: stagePostDrain, apply: setReservedResources},
		// upgrade_node.sh set_rke2_device_permissions (fact 51, v1.5.0 on): only if absent.
		{name: "set_rke2_device_permissions", stage: stagePostDrain, apply: writeIfAbsent(cdiFile,
			"# handle the permission issue of Longhorn for CDI\n\"nonroot-devices\": true\n")},
		// upgrade_node.sh set_oem_cleanup_kubelet (fact 51): always written. A reboot
		// reverts cpu_manager_state to the installed one; removed at initramfs, it cannot
		// keep the kubelet from starting under a static CPU manager policy.
		{name: "set_oem_cleanup_kubelet", stage: stagePostDrain, apply: writeAlways(cleanupKubeletFile,
			"name: Cleanup Kubelet\nstages:\n    initramfs:\n        - commands:\n            - rm -f /var/lib/kubelet/cpu_manager_state\n")},
	}
}

// runRKE2Settings writes the release's RKE2 and kubelet settings of one stage on the node
// it runs on, unit by unit, in the release's order, saying what each did. Every unit is
// idempotent: a second run changes nothing more. A failed unit fails the run, naming it;
// the units before it stay done.
func runRKE2Settings(ctx context.Context, env *Env, args []string) error {
	var stage, repositoryURL, version string
	fs := newFlagSet(env, "rke2-settings")
	fs.StringVar(&stage, "stage", "", "which of the release's settings to write: pre-drain (before RKE2 restarts at the release) or post-drain (after, before the OS upgrade)")
	// Accepted so that every Plan runs the node program with the same flags.
	fs.StringVar(&repositoryURL, "repository-url", "", "accepted and unused: the settings need no repository")
	fs.StringVar(&version, "version", "", "accepted and unused: every supported release writes the same settings")
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	st := rke2SettingsStage(stage)
	if st != stagePreDrain && st != stagePostDrain {
		return usagef("--stage must be %s or %s, not %q", stagePreDrain, stagePostDrain, stage)
	}
	return applyRKE2Settings(ctx, env, st)
}

// applyRKE2Settings runs the units of one stage in order.
func applyRKE2Settings(ctx context.Context, env *Env, st rke2SettingsStage) error {
	for _, u := range rke2SettingsUnits() {
		if u.stage != st {
			continue
		}
		said, err := u.apply(ctx, env)
		if err != nil {
			return fmt.Errorf("%s: %w", u.name, err)
		}
		env.say("%s: %s\n", u.name, said)
	}
	return nil
}

func removeCanalConfig(_ context.Context, env *Env) (string, error) {
	err := os.Remove(env.host().Path(canalConfigManifest))
	switch {
	case errors.Is(err, os.ErrNotExist):
		return canalConfigManifest + " is absent", nil
	case err != nil:
		return "", fmt.Errorf("remove %s on the host: %w", canalConfigManifest, err)
	}
	return "removed " + canalConfigManifest, nil
}

// writeAlways writes a host file with content, whatever was there.
func writeAlways(path, content string) func(context.Context, *Env) (string, error) {
	return func(_ context.Context, env *Env) (string, error) {
		if err := writeHostFile(env.host(), path, content); err != nil {
			return "", err
		}
		return "wrote " + path, nil
	}
}

// writeIfAbsent writes a host file with content unless the file exists: what is there
// (the user's, or an earlier release's) is kept.
func writeIfAbsent(path, content string) func(context.Context, *Env) (string, error) {
	return func(_ context.Context, env *Env) (string, error) {
		exists, err := hostFileExists(env.host(), path)
		if err != nil {
			return "", err
		}
		if exists {
			return path + " exists: kept as it is", nil
		}
		if err := writeHostFile(env.host(), path, content); err != nil {
			return "", err
		}
		return "wrote " + path, nil
	}
}

// setReservedResources writes, unless the file exists, the kubelet's system-reserved and
// kube-reserved CPU, which a static CPU manager policy requires: twice the release's
// reservation for the host's CPUs (`nproc` on the host, as the release runs it), split
// 2:3 between system and kube, in the release's integer arithmetic.
func setReservedResources(ctx context.Context, env *Env) (string, error) {
	exists, err := hostFileExists(env.host(), reservedFile)
	if err != nil {
		return "", err
	}
	if exists {
		return reservedFile + " exists: kept as it is (a changed reservation formula does not reach it, as in the release)", nil
	}
	out, err := env.host().Run(ctx, Command{Name: "nproc"})
	if err != nil {
		return "", fmt.Errorf("count the host's CPUs: %w", err)
	}
	cores, err := strconv.Atoi(strings.TrimSpace(string(out)))
	if err != nil {
		return "", fmt.Errorf("the host's nproc said %q, not a number of CPUs", strings.TrimSpace(string(out)))
	}
	reserved := reservedMilliCPU(cores, harvesterMaxPods)
	system, kube := reserved*2*2/5, reserved*2*3/5
	content := fmt.Sprintf("kubelet-arg+:\n- \"system-reserved=cpu=%dm\"\n- \"kube-reserved=cpu=%dm\"\n", system, kube)
	if err := writeHostFile(env.host(), reservedFile, content); err != nil {
		return "", err
	}
	return fmt.Sprintf("wrote %s (%d CPUs: system-reserved %dm, kube-reserved %dm)", reservedFile, cores, system, kube), nil
}

// reservedMilliCPU is upgrade_node.sh calculateCPUReservedInMilliCPU: 6% of the first
// core, 1% of the second, 0.5% of the third and fourth, 0.25% of each further core, and
// 400m more when more than 110 pods may run; 0 for a count that cannot be.
func reservedMilliCPU(cores, maxPods int) int {
	if cores <= 0 || maxPods <= 0 {
		return 0
	}
	reserved := 6 * 1000 / 100
	if cores > 1 {
		reserved += 1 * 1000 / 100
	}
	if cores > 2 {
		reserved += 2 * 500 / 100
	}
	if cores > 4 {
		reserved += (cores - 4) * 250 / 100
	}
	if maxPods > 110 {
		reserved += 400
	}
	return reserved
}
