package healthgate

import (
	"context"
	"fmt"

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

func evaluateCEL(ctx context.Context, g *inplacev1.CELGate, workload client.Client) (bool, string) {
	prg, err := CompileCEL(g.Expression)
	if err != nil {
		return false, fmt.Sprintf("the CEL expression does not compile: %v", err)
	}
	gv, err := schema.ParseGroupVersion(g.Resource.APIVersion)
	if err != nil {
		return false, fmt.Sprintf("resource.apiVersion %q: %v", g.Resource.APIVersion, err)
	}
	list := &unstructured.UnstructuredList{}
	list.SetGroupVersionKind(gv.WithKind(g.Resource.Kind + "List"))
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
	if err := workload.List(ctx, list, opts...); err != nil {
		return false, fmt.Sprintf("list %s %s of the workload cluster: %v", g.Resource.APIVersion, g.Resource.Kind, err)
	}
	objects := make([]any, 0, len(list.Items))
	for i := range list.Items {
		objects = append(objects, list.Items[i].Object)
	}
	out, _, err := prg.ContextEval(ctx, map[string]any{"objects": objects})
	if err != nil {
		return false, fmt.Sprintf("the CEL expression failed on %d %s object(s): %v", len(objects), g.Resource.Kind, err)
	}
	b, ok := out.(types.Bool)
	if !ok {
		return false, fmt.Sprintf("the CEL expression gave %v (%s), not a bool", out, out.Type())
	}
	if !b {
		return false, fmt.Sprintf("%s is false over %d %s object(s)", g.Expression, len(objects), g.Resource.Kind)
	}
	return true, fmt.Sprintf("%s is true over %d %s object(s)", g.Expression, len(objects), g.Resource.Kind)
}
