package clusterchecks

import "testing"

func TestRKE2CertificateDays(t *testing.T) {
	for _, tc := range []struct {
		name        string
		annotations map[string]string
		want        int
	}{
		{"no annotation: the default", nil, DefaultMinCertsExpirationDays},
		{"the plan's minimum", map[string]string{AnnotationMinCertsExpirationDays: "30"}, 30},
		{"a value the APIServerCertificates check refuses: the default", map[string]string{AnnotationMinCertsExpirationDays: "soon"}, DefaultMinCertsExpirationDays},
		{"skipped: no check", map[string]string{AnnotationMinCertsExpirationDays: "30", SkipCheckAnnotationPrefix + CheckRKE2Certificates: "true"}, 0},
		{"a skip annotation not true: checked", map[string]string{SkipCheckAnnotationPrefix + CheckRKE2Certificates: "false"}, DefaultMinCertsExpirationDays},
	} {
		if got := RKE2CertificateDays(tc.annotations); got != tc.want {
			t.Errorf("%s: %d, want %d", tc.name, got, tc.want)
		}
	}
}
