package preflight

import inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"

// FailureBudgetGateName names the gate of the Cluster's failure budget.
const FailureBudgetGateName = "FailureBudget"

// failureBudgetGate keeps every task of a Cluster from starting nodes once the Cluster's
// failed nodes reached its failure budget: a person looks before anything more is touched.
func failureBudgetGate(in GateInput) GateResult {
	if in.FailureBudgetExhausted == "" {
		return GateResult{Name: FailureBudgetGateName, Open: true}
	}
	return GateResult{Name: FailureBudgetGateName, Reason: inplacev1.FailureBudgetExhaustedReason, Message: in.FailureBudgetExhausted}
}
