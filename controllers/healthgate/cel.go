package healthgate

import (
	"context"
	"fmt"
	"strings"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/common/types"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"

	inplacev1 "github.com/capi-inplace/capi-inplace/api/v1alpha1"
)

// celCostLimit bounds the work of one expression, as the API server bounds its CEL
// validation rules: a runaway expression is a red gate, not a stuck controller.
const celCostLimit = 10_000_000

// CompileCEL compiles a gate's expression over `objects`, a list of dyn maps, and checks
// that it gives a bool.
func CompileCEL(expression string) (cel.Program, error) {
	env, err := cel.NewEnv(cel.Variable("objects", cel.ListType(cel.DynType)))
	if err != nil {
		return nil, err
	}
	ast, iss := env.Compile(expression)
	if iss.Err() != nil {
		return nil, iss.Err()
	}
	if ast.OutputType() != cel.BoolType && ast.OutputType() != cel.DynType {
		return nil, fmt.Errorf("the expression gives %s, not a bool", ast.OutputType())
	}
	return env.Program(ast, cel.CostLimit(celCostLimit), cel.InterruptCheckFrequency(100))
}

// celPageSize is how many objects a CEL gate asks the API server for at a time.
const celPageSize = 500

func evaluateCEL(ctx context.Context, g *inplacev1.CELGate, workload client.Client, policy *Policy) (bool, string) {
	prg, err := CompileCEL(g.Expression)
	if err != nil {
		return false, fmt.Sprintf("the CEL expression does not compile: %v", err)
	}
	gv, err := schema.ParseGroupVersion(g.Resource.APIVersion)
	if err != nil {
		return false, fmt.Sprintf("resource.apiVersion %q: %v", g.Resource.APIVersion, err)
	}
	if policy.celDenied(gv.Group, g.Resource.Kind) {
		return false, fmt.Sprintf("CEL gates may not read %s %s (the manager's --gate-cel-denied-kinds); read another kind that shows what the gate checks", g.Resource.APIVersion, g.Resource.Kind)
	}
	opts := []client.ListOption{}
	if g.Resource.Namespace != "" {
		opts = append(opts, client.InNamespace(g.Resource.Namespace))
	}
	if g.Resource.Selector != nil {
		sel, err := metav1.LabelSelectorAsSelector(g.Resource.Selector)
		if err != nil {
			return false, fmt.Sprintf("resource.selector: %v", err)
		}
		opts = append(opts, client.MatchingLabelsSelector{Selector: sel})
	}
	// Page by page, so that neither the API server nor the manager holds more than the
	// bound.
	maxObjects := policy.celMaxObjects()
	objects := []any{}
	for cont := ""; ; {
		list := &unstructured.UnstructuredList{}
		list.SetGroupVersionKind(gv.WithKind(g.Resource.Kind + "List"))
		if err := workload.List(ctx, list, append(opts, client.Limit(min(celPageSize, maxObjects+1)), client.Continue(cont))...); err != nil {
			return false, fmt.Sprintf("list %s %s of the workload cluster: %v", g.Resource.APIVersion, g.Resource.Kind, err)
		}
		for i := range list.Items {
			objects = append(objects, list.Items[i].Object)
		}
		if len(objects) > maxObjects {
			return false, fmt.Sprintf("the gate reads more than %d %s objects (the manager's --gate-cel-max-objects); narrow resource.namespace or resource.selector", maxObjects, g.Resource.Kind)
		}
		if cont = list.GetContinue(); cont == "" {
			break
		}
	}
	out, _, err := prg.ContextEval(ctx, map[string]any{"objects": objects})
	if err != nil {
		return false, fmt.Sprintf("the CEL expression failed on %d %s object(s): %s (the rest of the error is not shown: it may quote the objects); guard a field an object may lack with has(...)",
			len(objects), g.Resource.Kind, celErrorKind(err))
	}
	b, ok := out.(types.Bool)
	if !ok {
		// Never the value: it is the workload cluster's data, and status, events and logs
		// are read by others than those who may read that data.
		return false, fmt.Sprintf("the CEL expression gave a %s, not a bool; make it give true or false", out.Type().TypeName())
	}
	if !b {
		return false, fmt.Sprintf("%s is false over %d %s object(s)", g.Expression, len(objects), g.Resource.Kind)
	}
	return true, fmt.Sprintf("%s is true over %d %s object(s)", g.Expression, len(objects), g.Resource.Kind)
}

// celErrorKind is the part of an evaluation error that names what went wrong, before any
// detail: cel-go's errors go on to quote values ("no such key: <key>", a string that does
// not parse as a number), which may be the objects' data.
func celErrorKind(err error) string {
	msg := err.Error()
	if i := strings.Index(msg, ":"); i >= 0 {
		msg = msg[:i]
	}
	if len(msg) > 80 {
		msg = msg[:80]
	}
	return strings.TrimSpace(msg)
}
