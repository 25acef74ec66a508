package main

import (
	"encoding/json"
	"sort"
	"strings"
)

// schemaJSON: the served resources' properties, types and secrets (no docs), for `pulumi
// package get-schema` and the like; the SDK itself does not read it.
func schemaJSON(version string) string {
	types := map[kind]map[string]any{
		kInt: {"type": "integer"}, kBool: {"type": "boolean"}, kString: {"type": "string"},
		kStringMap: {"type": "object", "additionalProperties": map[string]any{"type": "string"}},
	}
	res := map[string]any{}
	for token, r := range resources {
		inputs, props := map[string]any{}, map[string]any{}
		var required, requiredInputs []string
		for _, a := range r.attrs {
			t := map[string]any{}
			for k, v := range types[a.kind] {
				t[k] = v
			}
			if a.secret {
				t["secret"] = true
			}
			props[a.name] = t
			if a.name != "keepers" && a.name != "overrideSpecial" && a.name != "prefix" {
				required = append(required, a.name)
			}
			if !a.output {
				inputs[a.name] = t
				if a.required {
					requiredInputs = append(requiredInputs, a.name)
				}
			}
		}
		sort.Strings(required)
		sort.Strings(requiredInputs)
		res[token] = map[string]any{
			"properties": props, "inputProperties": inputs, "required": required,
			"requiredInputs": requiredInputs,
			"stateInputs":    map[string]any{"type": "object", "properties": props},
		}
	}
	b, _ := json.Marshal(map[string]any{
		"name": "random", "version": version, "displayName": "random",
		"description": "Stand-in for pulumi-random: " + strings.Join(keys(), ", "),
		"resources":   res,
		// as pulumi-random's schema: the module of index/randomPassword is index
		"meta": map[string]any{"moduleFormat": "(.*)(?:/[^/]*)"},
	})
	return string(b)
}

func keys() []string {
	var ks []string
	for k := range resources {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	return ks
}
