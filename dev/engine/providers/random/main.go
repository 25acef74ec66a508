// pulumi-resource-random: a stand-in for pulumi-random v4.21.4, whose module the Go proxy here
// refuses (scripts/engine.sh builds it). It serves RandomPassword, RandomString and RandomId
// with terraform-provider-random's semantics as the bridge shows them to the engine: defaults
// planned into the state, every argument change a replacement, `result` (RandomPassword) and
// `bcryptHash` secret, nothing generated in a preview (the outputs are unknown there), values
// from crypto/rand. Other random resources are not served.
package main

import (
	"context"
	"fmt"
	"os"
	"strings"

	p "github.com/pulumi/pulumi-go-provider"
	"github.com/pulumi/pulumi/sdk/v3/go/property"
)

// set by the build: -X main.version=v4.21.4
var version = "v0.0.0-dev"

func main() {
	prov := p.Provider{
		GetSchema: func(context.Context, p.GetSchemaRequest) (p.GetSchemaResponse, error) {
			return p.GetSchemaResponse{Schema: schemaJSON(strings.TrimPrefix(version, "v"))}, nil
		},
		CheckConfig: func(_ context.Context, req p.CheckRequest) (p.CheckResponse, error) {
			return p.CheckResponse{Inputs: req.Inputs}, nil
		},
		DiffConfig: func(context.Context, p.DiffRequest) (p.DiffResponse, error) { return p.DiffResponse{}, nil },
		Check:      check,
		Diff:       diff,
		Create:     create,
		Read:       read,
		Update:     update,
		Delete:     func(context.Context, p.DeleteRequest) error { return nil }, // nothing exists outside the state
	}
	if err := prov.Run(context.Background(), "random", strings.TrimPrefix(version, "v")); err != nil {
		fmt.Fprintf(os.Stderr, "Error: %s", err.Error())
		os.Exit(1)
	}
}

func lookup(token string) (*resourceSpec, error) {
	if r, ok := resources[token]; ok {
		return r, nil
	}
	return nil, fmt.Errorf("unknown resource type %q (this stand-in serves RandomPassword, RandomString, RandomId)", token)
}

// plain is v without secrets, as a Go value (nil for null; property.Computed stays computed).
func plain(v property.Value) any {
	switch {
	case v.IsNull():
		return nil
	case v.IsComputed():
		return property.Computed
	case v.IsBool():
		return v.AsBool()
	case v.IsNumber():
		return v.AsNumber()
	case v.IsString():
		return v.AsString()
	case v.IsMap():
		m := map[string]any{}
		for k, e := range v.AsMap().All {
			m[k] = plain(e)
		}
		return m
	}
	return fmt.Sprintf("%v", v)
}

func known(v property.Value) bool { return !v.HasComputed() }

// plan: the arguments as terraform plans them, with their defaults; input values keep their
// secretness (the bridge keeps a secret input secret in the state).
func plan(r *resourceSpec, inputs property.Map) map[string]property.Value {
	out := map[string]property.Value{}
	for _, a := range r.attrs {
		if a.output {
			continue
		}
		if v, ok := inputs.GetOk(a.name); ok && !v.IsNull() {
			out[a.name] = v
		} else if a.def != nil {
			out[a.name] = defaultValue(a.def)
		}
	}
	if r.attr("numeric") != nil {
		// number is numeric's deprecated twin: unset both -> true, one set -> the other follows
		number, hasNumber := out["number"]
		numeric, hasNumeric := out["numeric"]
		switch {
		case !hasNumber && !hasNumeric:
			out["number"], out["numeric"] = property.New(true), property.New(true)
		case !hasNumber:
			out["number"] = numeric
		case !hasNumeric:
			out["numeric"] = number
		}
	}
	return out
}

func defaultValue(d any) property.Value {
	switch d := d.(type) {
	case bool:
		return property.New(d)
	case float64:
		return property.New(d)
	case string:
		return property.New(d)
	}
	panic(fmt.Sprintf("default %v", d))
}

func plainMap(m map[string]property.Value) map[string]any {
	out := map[string]any{}
	for k, v := range m {
		out[k] = plain(v)
	}
	return out
}

func check(_ context.Context, req p.CheckRequest) (p.CheckResponse, error) {
	r, err := lookup(string(req.Urn.Type()))
	if err != nil {
		return p.CheckResponse{}, err
	}
	var failures []p.CheckFailure
	fail := func(prop, format string, args ...any) {
		failures = append(failures, p.CheckFailure{Property: prop, Reason: fmt.Sprintf(format, args...)})
	}
	for _, a := range r.attrs {
		v, ok := req.Inputs.GetOk(a.name)
		if a.output {
			continue
		}
		if a.required && (!ok || v.IsNull()) {
			fail(a.name, "Missing required argument: the argument %q is required, but no definition was found.", a.name)
			continue
		}
		if !ok || v.IsNull() || v.IsComputed() {
			continue
		}
		good := map[kind]bool{kInt: v.IsNumber(), kBool: v.IsBool(), kString: v.IsString(), kStringMap: v.IsMap()}[a.kind]
		if !good {
			fail(a.name, "Inappropriate value for attribute %q", a.name)
		}
	}
	if len(failures) > 0 || r.attr("length") == nil {
		return p.CheckResponse{Inputs: req.Inputs, Failures: failures}, nil
	}
	// the password/string validators
	given := func(name string) (any, bool) {
		v, ok := req.Inputs.GetOk(name)
		if !ok || v.IsNull() || !known(v) {
			return nil, false
		}
		return plain(v), true
	}
	if l, ok := given("length"); ok {
		sum, all := 0.0, true
		for _, m := range []string{"minUpper", "minLower", "minNumeric", "minSpecial"} {
			if v, ok := given(m); ok {
				sum += v.(float64)
			} else if v, ok := req.Inputs.GetOk(m); ok && !known(v) {
				all = false
			}
		}
		if l.(float64) < 1 {
			fail("length", "Attribute length value must be at least 1, got: %v", l)
		} else if all && l.(float64) < sum {
			fail("length", "Attribute length value must be at least sum of min_upper + min_lower + min_numeric + min_special, got: %v", l)
		}
	}
	number, hasNumber := given("number")
	numeric, hasNumeric := given("numeric")
	if hasNumber && hasNumeric && number != numeric {
		fail("numeric", "Number and numeric are both configured with different values: number is deprecated, use numeric instead")
	}
	for _, name := range []string{"number", "numeric"} {
		v, ok := given(name)
		if !ok || v.(bool) {
			continue
		}
		someTrue := false
		for _, other := range []string{"special", "upper", "lower"} {
			if o, ok := given(other); !ok || o.(bool) { // unset means its default, true
				someTrue = true
			}
		}
		if !someTrue {
			fail(name, "At least one attribute out of [special upper lower] must be specified as true")
		}
	}
	return p.CheckResponse{Inputs: req.Inputs, Failures: failures}, nil
}

// same reports whether a planned argument equals its value in state, with upstream's plan
// modifiers: keepers compare without null-valued keys (null and {} alike), overrideSpecial ""
// in state equals unset.
func same(name string, planned, state property.Value) bool {
	if !known(planned) {
		return false
	}
	pv, sv := plain(planned), plain(state)
	switch name {
	case "keepers":
		return fmt.Sprint(dropNulls(pv)) == fmt.Sprint(dropNulls(sv))
	case "overrideSpecial":
		if pv == nil && sv == "" {
			return true
		}
	}
	return fmt.Sprintf("%#v", pv) == fmt.Sprintf("%#v", sv)
}

func dropNulls(v any) map[string]any {
	out := map[string]any{}
	if m, ok := v.(map[string]any); ok {
		for k, e := range m {
			if e != nil {
				out[k] = e
			}
		}
	}
	return out
}

func diff(_ context.Context, req p.DiffRequest) (p.DiffResponse, error) {
	r, err := lookup(string(req.Urn.Type()))
	if err != nil {
		return p.DiffResponse{}, err
	}
	planned := plan(r, req.Inputs)
	detailed := map[string]p.PropertyDiff{}
	for _, a := range r.attrs {
		if a.output {
			continue
		}
		nv, ok := planned[a.name]
		if !ok {
			nv = property.New(property.Null)
		}
		ov := req.State.Get(a.name)
		if same(a.name, nv, ov) {
			continue
		}
		kind := p.UpdateReplace // every argument RequiresReplace
		if ov.IsNull() {
			kind = p.AddReplace
		} else if nv.IsNull() {
			kind = p.DeleteReplace
		}
		detailed[a.name] = p.PropertyDiff{Kind: kind, InputDiff: true}
	}
	return p.DiffResponse{HasChanges: len(detailed) > 0, DetailedDiff: detailed}, nil
}

func create(_ context.Context, req p.CreateRequest) (p.CreateResponse, error) {
	r, err := lookup(string(req.Urn.Type()))
	if err != nil {
		return p.CreateResponse{}, err
	}
	props := plan(r, req.Properties)
	if req.DryRun {
		for _, a := range r.attrs {
			if a.output {
				props[a.name] = property.New(property.Computed).WithSecret(a.secret)
			}
		}
		props["id"] = property.New(property.Computed)
		return p.CreateResponse{Properties: property.NewMap(props)}, nil
	}
	for name, v := range props {
		if !known(v) {
			return p.CreateResponse{}, fmt.Errorf("%s is unknown at create", name)
		}
	}
	outs, err := r.generate(plainMap(props))
	if err != nil {
		return p.CreateResponse{}, err
	}
	for _, a := range r.attrs {
		if a.output {
			props[a.name] = property.New(outs[a.name].(string)).WithSecret(a.secret)
		}
	}
	// the bridge keeps terraform's id attribute among the outputs, and the schema version
	id := r.id(outs)
	props["id"] = property.New(id)
	if r.schemaVersion > 0 {
		props["__meta"] = property.New(fmt.Sprintf(`{"schema_version":"%d"}`, r.schemaVersion))
	}
	return p.CreateResponse{ID: id, Properties: property.NewMap(props)}, nil
}

// read: upstream's Read keeps the state as it is; an import (no state) is not supported here.
func read(_ context.Context, req p.ReadRequest) (p.ReadResponse, error) {
	if req.Properties.Len() == 0 {
		return p.ReadResponse{}, fmt.Errorf("import is not supported by this stand-in of pulumi-random")
	}
	return p.ReadResponse{ID: req.ID, Properties: req.Properties, Inputs: req.Inputs}, nil
}

// update is reached only for a change that needs no replacement (a keeper set to null): the
// new arguments with the outputs already generated.
func update(_ context.Context, req p.UpdateRequest) (p.UpdateResponse, error) {
	r, err := lookup(string(req.Urn.Type()))
	if err != nil {
		return p.UpdateResponse{}, err
	}
	props := plan(r, req.Inputs)
	for _, a := range r.attrs {
		if a.output {
			props[a.name] = req.State.Get(a.name)
		}
	}
	for _, k := range []string{"id", "__meta"} {
		if v, ok := req.State.GetOk(k); ok {
			props[k] = v
		}
	}
	return p.UpdateResponse{Properties: property.NewMap(props)}, nil
}
