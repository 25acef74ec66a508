package local

import (
	"github.com/pulumi/pulumi-go-provider/infer"

	"twinspark.local/engine-providers/command/internal/output"
)

// Logging is its own type here so that its token is command:local:Logging.
type Logging string

func (Logging) Values() []infer.EnumValue[Logging] {
	var vs []infer.EnumValue[Logging]
	for _, v := range output.LogValues {
		vs = append(vs, infer.EnumValue[Logging]{Name: v[0], Value: Logging(v[0]), Description: v[1]})
	}
	return vs
}

func (l *Logging) streams() (stdout, stderr bool) {
	var s *string
	if l != nil {
		v := string(*l)
		s = &v
	}
	return output.Logs(s, "stdout"), output.Logs(s, "stderr")
}
