package nodeprogram

import (
	"context"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"

	"sigs.k8s.io/yaml"
)

// The node migrations of the v1.6 to v1.7 hop, which Harvester's post-drain runs right
// before upgrade_os when the upgrade's previous version matches ^v1\.6\.[0-9]$
// (package/upgrade/upgrade_node.sh at v1.7.0 to v1.7.3: generate_networkmanager_config and
// the hostname function after it, named in hopMigrations; harvester-release-steps.md fact
// 53). Harvester v1.7 moves
// the OS from wicked to NetworkManager: without them the node boots the new OS with no
// network configuration, or with a DHCP lease for another client id, or under another
// name, and never rejoins.
const (
	// custom90 holds the node's cloud-init configuration, whose PERSISTENT_STATE_PATHS
	// say which directories survive a reboot.
	custom90 = "/oem/90_custom.yaml"
	// nmConnections is where NetworkManager's profiles persist on a Harvester v1.7 node.
	nmConnections = "/usr/local/.state/etc-NetworkManager.bind/system-connections"
	// hostnameOverride keeps the node's current name at boot.
	hostnameOverride = "/oem/92_hostname_override.yaml"
	// installerInImage is the release's harvester-installer in the new OS image: the
	// release builds it static and installs it into the OS image (harvester-installer
	// scripts/build at v1.7.0, v1.7.1, v1.8.0: package/harvester-os/files/usr/bin), where
	// Harvester's upgrade image also has a copy, the one its script runs.
	installerInImage = "/usr/bin/harvester-installer"
)

// fromV16 is how the release keys the hop's migrations on the previous version.
var fromV16 = regexp.MustCompile(`^v1\.6\.[0-9]$`)

// hopMigration is one node migration: its name (the release script's function, and
// the part of it) and what it does.
type hopMigration struct {
	name string
	run  func(context.Context, *Env) error
}

// migrationsFrom are the node migrations the release runs when the upgrade's previous
// version is previous, in its order; none for a previous version it does not key on.
// installer is the host path of the release's harvester-installer they run.
func migrationsFrom(previous, installer string) []hopMigration {
	if !fromV16.MatchString(previous) {
		return nil
	}
	return []hopMigration{
		{"generate_networkmanager_config: persistent paths", persistNetworkManagerState},
		{"generate_networkmanager_config", func(ctx context.Context, env *Env) error { return generateNetworkManagerConfig(ctx, env, installer) }},
		{"generate_networkmanager_config: DHCP client id", keepDHCPClientID},
		{"generate_hostname_persistance", persistHostname}, //nolint:misspell // the release script's own function name
	}
}

// HopMigrations names, in order, the node migrations os-upgrade runs before the OS
// install when its --previous-version is previous (the demo names them from the os
// Plan's arguments).
func HopMigrations(previous string) []string {
	var out []string
	for _, m := range migrationsFrom(previous, "") {
		out = append(out, m.name)
	}
	return out
}

// hopMigrations runs the node migrations of the hop from previous, in the release's
// order, with installer the release's harvester-installer: the new OS image's, mounted
// at rootfsMountPoint, or the host's own when the host runs the release's OS already. A
// previous version the release does not key on runs none.
func hopMigrations(ctx context.Context, env *Env, previous, installer string) error {
	migrations := migrationsFrom(previous, installer)
	if len(migrations) == 0 {
		return nil
	}
	env.say("the nodes ran %s: the v1.6 to v1.7 node migrations (NetworkManager, hostname)\n", previous)
	for _, m := range migrations {
		if err := m.run(ctx, env); err != nil {
			return fmt.Errorf("%s: %w", m.name, err)
		}
	}
	return nil
}

// persistNetworkManagerState adds /var/lib/NetworkManager and /etc/NetworkManager right
// after /var/lib/wicked on each PERSISTENT_STATE_PATHS line of 90_custom.yaml that names
// wicked and not NetworkManager yet, as the release's sed does; a file or a line not
// shaped so is left, as the release leaves it (it only says so).
func persistNetworkManagerState(_ context.Context, env *Env) error {
	path := env.host().Path(custom90)
	data, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		env.say("%s not found: persistent paths left\n", custom90)
		return nil
	}
	if err != nil {
		return err
	}
	lines := strings.Split(string(data), "\n")
	changed := false
	for i, l := range lines {
		key := strings.Index(l, "PERSISTENT_STATE_PATHS:")
		wicked := strings.LastIndex(l, "/var/lib/wicked")
		if key < 0 || wicked < key || strings.Contains(l, "/var/lib/NetworkManager") {
			continue
		}
		end := wicked + len("/var/lib/wicked")
		lines[i] = l[:end] + " /var/lib/NetworkManager /etc/NetworkManager" + l[end:]
		changed = true
	}
	if !changed {
		return nil
	}
	env.say("adding /var/lib/NetworkManager and /etc/NetworkManager to PERSISTENT_STATE_PATHS in %s\n", custom90)
	info, err := os.Stat(path)
	if err != nil {
		return err
	}
	return os.WriteFile(path, []byte(strings.Join(lines, "\n")), info.Mode().Perm())
}

// generateNetworkManagerConfig runs the release's own `harvester-installer
// generate-network-config` (installer), which writes the management
// interface's NetworkManager profiles from harvester.config (and writes nothing when
// profiles are there already). Its failure fails the OS upgrade, as the script's set -e.
func generateNetworkManagerConfig(ctx context.Context, env *Env, installer string) error {
	out, err := env.host().Run(ctx, Command{Name: installer, Args: []string{
		"generate-network-config", "--config", harvesterConfig, "--connection-path", nmConnections,
	}})
	if err != nil {
		return err
	}
	if s := strings.TrimSpace(string(out)); s != "" {
		env.say("%s\n", s)
	}
	return nil
}

// keepDHCPClientID copies the client id of wicked's DHCP lease into the DHCP profile, so
// that the node keeps its address: only when exactly one profile has method=auto and
// exactly one wicked lease exists, and the profile has no client id yet.
func keepDHCPClientID(_ context.Context, env *Env) error {
	h := env.host()
	profiles, _ := filepath.Glob(filepath.Join(h.Path(nmConnections), "*nmconnection"))
	var dhcp []string
	for _, p := range profiles {
		data, err := os.ReadFile(p)
		if err != nil {
			return err
		}
		if hasLine(string(data), "method=auto") {
			dhcp = append(dhcp, p)
		}
	}
	leases, _ := filepath.Glob(filepath.Join(h.Path("/var/lib/wicked"), "lease*xml"))
	if len(dhcp) != 1 || len(leases) != 1 {
		return nil
	}
	id, err := leaseClientID(leases[0])
	if err != nil {
		return err
	}
	if id == "" {
		env.say("no DHCP client id in %s\n", filepath.Base(leases[0]))
		return nil
	}
	data, err := os.ReadFile(dhcp[0])
	if err != nil {
		return err
	}
	profile := string(data)
	for _, l := range strings.Split(profile, "\n") {
		if strings.HasPrefix(l, "dhcp-client-id") {
			env.say("%s already has a DHCP client id\n", filepath.Base(dhcp[0]))
			return nil
		}
	}
	lines := strings.Split(profile, "\n")
	for i, l := range lines {
		if l == "method=auto" {
			lines = append(lines[:i+1], append([]string{"dhcp-client-id=" + id}, lines[i+1:]...)...)
			break
		}
	}
	env.say("adding wicked's DHCP client id to %s\n", filepath.Base(dhcp[0]))
	info, err := os.Stat(dhcp[0])
	if err != nil {
		return err
	}
	return os.WriteFile(dhcp[0], []byte(strings.Join(lines, "\n")), info.Mode().Perm())
}

func hasLine(text, line string) bool {
	for _, l := range strings.Split(text, "\n") {
		if l == line {
			return true
		}
	}
	return false
}

// leaseClientID is what the release reads with yq from wicked's lease:
// .lease."ipv4:dhcp".client-id.
func leaseClientID(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer func() { _ = f.Close() }()
	d := xml.NewDecoder(f)
	var stack []string
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			return "", nil
		}
		if err != nil {
			return "", fmt.Errorf("read wicked's lease %s: %w", path, err)
		}
		switch t := tok.(type) {
		case xml.StartElement:
			name := t.Name.Local
			if t.Name.Space != "" {
				name = t.Name.Space + ":" + name
			}
			stack = append(stack, name)
		case xml.EndElement:
			stack = stack[:len(stack)-1]
		case xml.CharData:
			if strings.Join(stack, "/") == "lease/ipv4:dhcp/client-id" {
				return strings.TrimSpace(string(t)), nil
			}
		}
	}
}

// persistHostname writes a boot stage that keeps the node's current name when
// harvester.config names it otherwise (an FQDN install of v1.5 or older, whose node
// registered under the short name), unless an override is there already.
func persistHostname(ctx context.Context, env *Env) error {
	h := env.host()
	if _, err := os.Stat(h.Path(hostnameOverride)); err == nil {
		env.say("%s already exists: kept\n", hostnameOverride)
		return nil
	}
	data, err := os.ReadFile(h.Path(harvesterConfig))
	if err != nil {
		return fmt.Errorf("read %s: %w", harvesterConfig, err)
	}
	var cfg struct {
		OS struct {
			Hostname string `json:"hostname"`
		} `json:"os"`
	}
	if err := yaml.Unmarshal(data, &cfg); err != nil {
		return fmt.Errorf("read %s: %w", harvesterConfig, err)
	}
	out, err := h.Run(ctx, Command{Name: "hostname"})
	if err != nil {
		return err
	}
	current := strings.TrimSpace(string(out))
	if current == cfg.OS.Hostname {
		return nil
	}
	env.say("the node is %s, harvester.config names %s: writing %s\n", current, cfg.OS.Hostname, hostnameOverride)
	override := fmt.Sprintf("name: %q\nstages:\n  network:\n  - hostname: %s\n", "ensure hostname persists across upgrade to NetworkManager", current)
	return writeHostFile(h, hostnameOverride, override)
}
