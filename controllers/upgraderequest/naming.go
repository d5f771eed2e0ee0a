package upgraderequest

import (
	"crypto/sha256"
	"encoding/hex"
	"strconv"
	"strings"
)

// maxTaskNameLength keeps task names usable as label values (the Machine claim and the
// NodeUpdate's task label carry the task's name).
const maxTaskNameLength = 63

// TaskName is the deterministic name of the UpgradeTask for a request: the target's name,
// the version and a short digest of the request, and for a later attempt of the same
// request (after the first failed or was aborted) -<attempt>. Long names are shortened,
// keeping the digest, so that the name stays a valid label value.
func TaskName(targetName, version, requestHash string, attempt int) string {
	suffix := "-" + shortHash(requestHash)
	if attempt > 1 {
		suffix += "-" + strconv.Itoa(attempt)
	}
	base := sanitize(targetName + "-" + version)
	if len(base)+len(suffix) > maxTaskNameLength {
		base = strings.TrimRight(base[:maxTaskNameLength-len(suffix)], "-.")
	}
	return base + suffix
}

// RetryNodeUpdateName is the deterministic name of the NodeUpdate with which a task tries
// a machine once more after its first NodeUpdate was skipped (drainPolicy Skip): the
// first one's name with -retry. The first one stays, as the record of the skip.
func RetryNodeUpdateName(taskName, machineName string) string {
	name := NodeUpdateName(taskName, machineName) + "-retry"
	if len(name) <= 253 {
		return name
	}
	suffix := "-" + shortHash(digest(name))
	return strings.TrimRight(name[:253-len(suffix)], "-.") + suffix
}

// NodeUpdateName is the deterministic name of a machine's NodeUpdate in a task, so that a
// restart finds the NodeUpdate it created instead of creating a second one.
func NodeUpdateName(taskName, machineName string) string {
	name := taskName + "-" + machineName
	if len(name) <= 253 {
		return name
	}
	suffix := "-" + shortHash(digest(name))
	return strings.TrimRight(name[:253-len(suffix)], "-.") + suffix
}

// LabelValue returns name when it is a valid label value, else a shortened form with a
// digest; used for the claim label of tasks created by hand with long names.
func LabelValue(name string) string {
	if len(name) <= 63 {
		return name
	}
	suffix := "-" + shortHash(digest(name))
	return strings.TrimRight(name[:63-len(suffix)], "-._") + suffix
}

func sanitize(s string) string {
	var b strings.Builder
	for _, r := range strings.ToLower(s) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9', r == '.', r == '-':
			b.WriteRune(r)
		default:
			b.WriteRune('-')
		}
	}
	return strings.Trim(b.String(), "-.")
}

func digest(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

func shortHash(h string) string {
	if len(h) > 8 {
		return h[:8]
	}
	return h
}
