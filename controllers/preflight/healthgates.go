package preflight

import (
	"fmt"
	"strings"
	"time"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

// HealthGate is the last result of one health gate.
type HealthGate struct {
	// Name is the gate's name.
	Name string
	// Green is true when the gate lets nodes start.
	Green bool
	// Message says why the gate is red.
	Message string
	// GreenSince is when the gate was last seen turning green; zero when red.
	GreenSince time.Time
}

// healthGate is closed while a health gate is red and, after a node ended, until every
// gate has been green for spec.gateSoak. It only keeps nodes from starting: a node in
// progress goes on.
func healthGate(in GateInput) GateResult {
	if len(in.Health) == 0 {
		return GateResult{Name: HealthGateName, Open: true}
	}
	var red []string
	var greenSince time.Time
	for _, g := range in.Health {
		if !g.Green {
			red = append(red, fmt.Sprintf("gate %s is red: %s", g.Name, g.Message))
			continue
		}
		if g.GreenSince.After(greenSince) {
			greenSince = g.GreenSince
		}
	}
	if len(red) > 0 {
		return GateResult{Name: HealthGateName, Reason: inplacev1.GateRedReason,
			Message: strings.Join(red, "; ") + "; no new node starts until every gate is green (a node in progress goes on)"}
	}
	soak := in.Spec.GateSoak
	if soak == nil || soak.Duration <= 0 || in.LastNodeCompletion.IsZero() {
		return GateResult{Name: HealthGateName, Open: true}
	}
	from := in.LastNodeCompletion
	if greenSince.After(from) {
		from = greenSince
	}
	until := from.Add(soak.Duration)
	if !in.Now.Before(until) {
		return GateResult{Name: HealthGateName, Open: true}
	}
	return GateResult{Name: HealthGateName, Reason: inplacev1.GateRedReason,
		Message:    fmt.Sprintf("every gate is green; spec.gateSoak %s: they must stay green until %s before the next node starts", soak.Duration, until.UTC().Format(time.RFC3339)),
		RetryAfter: until.Sub(in.Now)}
}
