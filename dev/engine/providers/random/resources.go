package main

// The resources as pulumi-random v4.21.4 bridges them from terraform-provider-random: its
// attribute names in Pulumi's camelCase, its defaults, its validators, and every argument
// RequiresReplace (so any input change replaces; there is never an in-place update).

type kind int

const (
	kInt kind = iota
	kBool
	kString
	kStringMap
)

type attr struct {
	name     string
	kind     kind
	required bool // a required argument
	def      any  // the default an unset argument plans to (nil: stays unset)
	output   bool // computed only
	secret   bool // Sensitive in the terraform schema
}

type resourceSpec struct {
	token string
	attrs []attr
	// id is the Pulumi id from the outputs
	id func(out map[string]any) string
	// generate computes the outputs from the planned arguments
	generate func(plan map[string]any) (map[string]any, error)
	// the terraform schema version, which the bridge records in the state's __meta (0: none)
	schemaVersion int
}

func (r *resourceSpec) attr(name string) *attr {
	for i := range r.attrs {
		if r.attrs[i].name == name {
			return &r.attrs[i]
		}
	}
	return nil
}

// The character-set arguments random_password and random_string share.
func stringAttrs() []attr {
	return []attr{
		{name: "keepers", kind: kStringMap},
		{name: "length", kind: kInt, required: true},
		{name: "special", kind: kBool, def: true},
		{name: "upper", kind: kBool, def: true},
		{name: "lower", kind: kBool, def: true},
		{name: "number", kind: kBool},  // planned with numeric (see planNumeric)
		{name: "numeric", kind: kBool}, // planned with number
		{name: "minNumeric", kind: kInt, def: 0.0},
		{name: "minUpper", kind: kInt, def: 0.0},
		{name: "minLower", kind: kInt, def: 0.0},
		{name: "minSpecial", kind: kInt, def: 0.0},
		{name: "overrideSpecial", kind: kString},
	}
}

var resources = map[string]*resourceSpec{
	"random:index/randomPassword:RandomPassword": {
		attrs: append(stringAttrs(),
			attr{name: "result", kind: kString, output: true, secret: true},
			attr{name: "bcryptHash", kind: kString, output: true, secret: true}),
		id:            func(map[string]any) string { return "none" },
		schemaVersion: 3,
		generate: func(plan map[string]any) (map[string]any, error) {
			s, err := randomString(plan)
			if err != nil {
				return nil, err
			}
			hash, err := bcryptHash(s)
			if err != nil {
				return nil, err
			}
			return map[string]any{"result": s, "bcryptHash": hash}, nil
		},
	},
	"random:index/randomString:RandomString": {
		attrs:         append(stringAttrs(), attr{name: "result", kind: kString, output: true}),
		id:            func(out map[string]any) string { return out["result"].(string) },
		schemaVersion: 2,
		generate: func(plan map[string]any) (map[string]any, error) {
			s, err := randomString(plan)
			return map[string]any{"result": s}, err
		},
	},
	"random:index/randomId:RandomId": {
		attrs: []attr{
			{name: "keepers", kind: kStringMap},
			{name: "byteLength", kind: kInt, required: true},
			{name: "prefix", kind: kString},
			{name: "b64Url", kind: kString, output: true},
			{name: "b64Std", kind: kString, output: true},
			{name: "hex", kind: kString, output: true},
			{name: "dec", kind: kString, output: true},
		},
		id:       func(out map[string]any) string { return out["__id"].(string) },
		generate: randomID,
	},
}

func init() {
	for token, r := range resources {
		r.token = token
	}
}
