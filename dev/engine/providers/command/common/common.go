// Package common holds the inputs every command resource has, as pulumi-command v1.2.1 names
// and tags them: a change to `triggers` replaces the resource (replaceOnChanges), a change to
// anything else updates it in place.
package common

import "github.com/pulumi/pulumi-go-provider/infer"

type ResourceInputs struct {
	Triggers *[]any  `pulumi:"triggers,optional" provider:"replaceOnChanges"`
	Create   *string `pulumi:"create,optional"`
	Update   *string `pulumi:"update,optional"`
	Delete   *string `pulumi:"delete,optional"`
}

func (c *ResourceInputs) Annotate(a infer.Annotator) {
	a.Describe(&c.Triggers, "Values whose change replaces the resource.")
	a.Describe(&c.Create, "Run once when the resource is created; also on an update when `update` is not set.")
	a.Describe(&c.Update, "Run when an input other than `triggers` changes; `create` runs when this is not set.")
	a.Describe(&c.Delete, "Run when the resource is deleted, with the inputs in state.")
}
