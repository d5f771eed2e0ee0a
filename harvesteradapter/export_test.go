package harvesteradapter

import inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"

// PlanName is planName for the package's external tests; kind is preload, rke2 or os.
func PlanName(kind string, nu *inplacev1.NodeUpdate) string { return planName(planKind(kind), nu) }
