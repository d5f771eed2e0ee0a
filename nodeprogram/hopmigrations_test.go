package nodeprogram

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// The v1.6 to v1.7 hop's node migrations, as upgrade_node.sh at v1.7.0 to v1.7.3 does
// them before upgrade_os (generate_networkmanager_config and the hostname function after
// it; harvester-release-steps.md fact 53), each written from the release's script.

const (
	installerPath = "/tmp/capi-inplace-rootfs/usr/bin/harvester-installer"
	custom90Paths = `        PERSISTENT_STATE_PATHS: "/etc/systemd /etc/rancher /etc/ssh /etc/iscsi /etc/cni /home /opt /root /usr/libexec /var/log /var/lib/elemental /var/lib/rancher /var/lib/kubelet /var/lib/wicked /var/lib/longhorn /var/lib/cni"`
)

// hopNode is a v1.6 node (SLE Micro 5.5) installed with an FQDN, on DHCP through wicked,
// whose new OS image holds the release's harvester-installer, which writes one DHCP
// profile as the release's generate-network-config does for a DHCP management interface.
func hopNode(t *testing.T) *fakeHost {
	t.Helper()
	host := osNode(t, "Harvester v1.6.1")
	host.write(t, "/oem/harvester.config", "os:\n  hostname: node-1.example.com\n  externalstorage:\n    enabled: false\n")
	host.write(t, custom90, "name: Harvester Configuration\nstages:\n  rootfs:\n  - environment:\n"+custom90Paths+"\n")
	host.write(t, "/var/lib/wicked/lease-mgmt-br-dhcp-ipv4.xml",
		"<lease>\n  <device>mgmt-br</device>\n  <ipv4:dhcp>\n    <client-id>ff:00:11:22:33:44:55:66</client-id>\n    <address>10.0.0.5</address>\n  </ipv4:dhcp>\n</lease>\n")
	host.tools["hostname"] = func(Command, []byte) ([]byte, error) { return []byte("node-1\n"), nil }
	host.tools[installerPath] = func(c Command, _ []byte) ([]byte, error) {
		dir := ""
		for i, a := range c.Args {
			if a == "--connection-path" && i+1 < len(c.Args) {
				dir = c.Args[i+1]
			}
		}
		if len(c.Args) == 0 || c.Args[0] != "generate-network-config" || dir == "" {
			return nil, errors.New("harvester-installer: usage")
		}
		if err := os.MkdirAll(host.Path(dir), 0o755); err != nil {
			return nil, err
		}
		profile := "[connection]\nid=bridge-mgmt\ntype=bridge\ninterface-name=mgmt-br\n\n[ipv4]\nmethod=auto\n\n[ipv6]\nmethod=disabled\n"
		return nil, os.WriteFile(filepath.Join(host.Path(dir), "bridge-mgmt.nmconnection"), []byte(profile), 0o600)
	}
	return host
}

func TestOSUpgradeFromV16GeneratesTheNetworkManagerConfigurationAndKeepsTheName(t *testing.T) {
	host := hopNode(t)
	installOn(t, host, "--previous-version=v1.6.1").expect(t, ExitOK)

	got, _ := readHost(t, host, custom90)
	want := strings.Replace(custom90Paths, "/var/lib/wicked", "/var/lib/wicked /var/lib/NetworkManager /etc/NetworkManager", 1)
	if !strings.Contains(got, want+"\n") {
		t.Errorf("90_custom.yaml is\n%s\nwant the line\n%s", got, want)
	}
	lines := host.commandLines()
	generate := slices.Index(lines, installerPath+" generate-network-config --config /oem/harvester.config --connection-path "+nmConnections)
	elemental := slices.IndexFunc(lines, func(l string) bool { return strings.HasPrefix(l, releaseElementalPath+" upgrade") })
	if generate < 0 || elemental < 0 || generate > elemental {
		t.Errorf("the release's harvester-installer did not generate the profiles before the OS install: %q", lines)
	}
	profile, _ := readHost(t, host, nmConnections+"/bridge-mgmt.nmconnection")
	if !strings.Contains(profile, "method=auto\ndhcp-client-id=ff:00:11:22:33:44:55:66\n") {
		t.Errorf("the DHCP profile does not keep wicked's client id right after method=auto:\n%s", profile)
	}
	override, there := readHost(t, host, "/oem/92_hostname_override.yaml")
	if !there || !strings.Contains(override, "hostname: node-1\n") || !strings.Contains(override, "network:") {
		t.Errorf("92_hostname_override.yaml (%t) is\n%s\nwant the network stage setting the current hostname node-1", there, override)
	}

	// Run again (a retried Job): nothing is added twice, an override is never replaced.
	host.write(t, "/oem/92_hostname_override.yaml", "# the user's own\n")
	installOn(t, host, "--previous-version=v1.6.1").expect(t, ExitOK)
	if again, _ := readHost(t, host, custom90); again != got {
		t.Errorf("90_custom.yaml changed again:\n%s", again)
	}
	if again, _ := readHost(t, host, nmConnections+"/bridge-mgmt.nmconnection"); strings.Count(again, "dhcp-client-id=") != 1 {
		t.Errorf("the client id was added twice:\n%s", again)
	}
	if again, _ := readHost(t, host, "/oem/92_hostname_override.yaml"); again != "# the user's own\n" {
		t.Errorf("an existing override was replaced: %q", again)
	}
}

func TestOSUpgradeRunsTheHopMigrationsOnlyFromV16(t *testing.T) {
	for _, previous := range []string{"v1.7.1", "", "v1.6.0-rc1"} {
		host := hopNode(t)
		args := []string{}
		if previous != "" {
			args = append(args, "--previous-version="+previous)
		}
		installOn(t, host, args...).expect(t, ExitOK)
		if got, _ := readHost(t, host, custom90); strings.Contains(got, "NetworkManager") {
			t.Errorf("previous %q: 90_custom.yaml changed", previous)
		}
		if hostHas(t, host, installerPath+" generate-network-config --config /oem/harvester.config --connection-path "+nmConnections) {
			t.Errorf("previous %q: the network configuration was generated", previous)
		}
		if _, there := readHost(t, host, "/oem/92_hostname_override.yaml"); there {
			t.Errorf("previous %q: a hostname override was written", previous)
		}
	}
}

func TestOSUpgradeFromV16LeavesWhatItCannotMatch(t *testing.T) {
	// Static addresses (no DHCP profile), a hostname that matches the configuration.
	host := hopNode(t)
	host.write(t, "/oem/harvester.config", "os:\n  hostname: node-1\n")
	host.tools[installerPath] = func(c Command, _ []byte) ([]byte, error) {
		return nil, os.WriteFile(host.Path(nmConnections+"/bridge-mgmt.nmconnection"), []byte("[ipv4]\nmethod=manual\naddress1=10.0.0.5/24\n"), 0o600)
	}
	if err := os.MkdirAll(host.Path(nmConnections), 0o755); err != nil {
		t.Fatal(err)
	}
	installOn(t, host, "--previous-version=v1.6.1").expect(t, ExitOK)
	if profile, _ := readHost(t, host, nmConnections+"/bridge-mgmt.nmconnection"); strings.Contains(profile, "dhcp-client-id") {
		t.Errorf("a static profile got a DHCP client id:\n%s", profile)
	}
	if _, there := readHost(t, host, "/oem/92_hostname_override.yaml"); there {
		t.Error("an override was written for a hostname that matches the configuration")
	}
}

func TestOSUpgradeFromV16StopsBeforeTheInstallWhenTheNetworkCannotBeGenerated(t *testing.T) {
	host := hopNode(t)
	host.tools[installerPath] = func(c Command, _ []byte) ([]byte, error) {
		return nil, commandError(c, errors.New("exit status 1"), []byte("no management interface"))
	}
	r := installOn(t, host, "--previous-version=v1.6.1")
	r.expect(t, ExitFailed, "generate_networkmanager_config", "no management interface")
	for _, l := range host.commandLines() {
		if strings.HasPrefix(l, releaseElementalPath+" upgrade") || strings.HasPrefix(l, "systemd-run") {
			t.Errorf("ran %q after the network configuration failed", l)
		}
	}
}

// HopMigrations names what hopMigrations runs, in its order: the v1.6 to v1.7
// migrations for a previous version of v1.6, none for another.
func TestHopMigrationsNames(t *testing.T) {
	want := []string{
		"generate_networkmanager_config: persistent paths", "generate_networkmanager_config",
		"generate_networkmanager_config: DHCP client id", "generate_hostname_persistance", //nolint:misspell // the release script's own function name
	}
	if got := HopMigrations("v1.6.1"); strings.Join(got, "|") != strings.Join(want, "|") {
		t.Errorf("HopMigrations(v1.6.1) = %q, want %q", got, want)
	}
	for _, previous := range []string{"v1.7.1", "v1.6.10", "", "v1.5.2"} {
		if got := HopMigrations(previous); len(got) != 0 {
			t.Errorf("HopMigrations(%q) = %q, want none", previous, got)
		}
	}
}

// TestOSUpgradeFromV16RunsTheMigrationsOnANodeAlreadyOnTheRelease: the release's
// post-drain runs the hop's node migrations before upgrade_os and its version check
// (upgrade_node.sh command_post_drain), so a node whose OS is already the release's gets
// them too, with its own harvester-installer (the release's, as it runs the release's
// OS); nothing is installed and no reboot is scheduled (issue #53).
func TestOSUpgradeFromV16RunsTheMigrationsOnANodeAlreadyOnTheRelease(t *testing.T) {
	host := hopNode(t)
	host.write(t, "/etc/os-release", "NAME=\"SL Micro\"\nPRETTY_NAME=\"Harvester v1.6.0\"\n") // the release's OS (releaseYAML)
	host.tools[installerInImage] = host.tools[installerPath]
	delete(host.tools, installerPath)
	installOn(t, host, "--previous-version=v1.6.1").expect(t, ExitOK)
	if !hostHas(t, host, installerInImage+" generate-network-config --config /oem/harvester.config --connection-path "+nmConnections) {
		t.Errorf("the host's harvester-installer did not generate the profiles: %q", host.commandLines())
	}
	if got, _ := readHost(t, host, custom90); !strings.Contains(got, "/var/lib/NetworkManager") {
		t.Errorf("90_custom.yaml does not persist NetworkManager's state:\n%s", got)
	}
	if _, there := readHost(t, host, "/oem/92_hostname_override.yaml"); !there {
		t.Error("no hostname override for a node installed with an FQDN")
	}
	for _, l := range host.commandLines() {
		if strings.Contains(l, "elemental") || strings.HasPrefix(l, "systemd-run") {
			t.Errorf("ran %q on a node already on the release's OS", l)
		}
	}
}
