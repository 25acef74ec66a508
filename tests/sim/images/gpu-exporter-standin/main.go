// A STAND-IN for utkuozdemir/nvidia_gpu_exporter 1.14, for the simulated Sparks, which have no
// GPU and no nvidia-smi: it serves, at /metrics, the nvidia_smi_* series the program's alerts and
// dashboards read (tests/observability_helpers.py GPU_EXPORTER_METRICS), with fixed values of a
// healthy GB10 at work. It accepts the two flags the program passes (components/observability.py
// gpu_exporter_command) and refuses any other, so a new flag shows up here first.
package main

import (
	"flag"
	"fmt"
	"log"
	"net/http"
	"os"
)

const help = `gpu-exporter-standin: a STAND-IN for nvidia_gpu_exporter (twinspark's simulator).
It reads no GPU: /metrics serves fixed nvidia_smi_* values of a healthy GB10.

`

var metrics = `# HELP nvidia_smi_temperature_gpu stand-in: fixed value
# TYPE nvidia_smi_temperature_gpu gauge
nvidia_smi_temperature_gpu{uuid="GPU-sim"} 61
# TYPE nvidia_smi_power_draw_watts gauge
nvidia_smi_power_draw_watts{uuid="GPU-sim"} 64.25
# TYPE nvidia_smi_utilization_gpu_ratio gauge
nvidia_smi_utilization_gpu_ratio{uuid="GPU-sim"} 0.95
# TYPE nvidia_smi_clocks_current_graphics_clock_hz gauge
nvidia_smi_clocks_current_graphics_clock_hz{uuid="GPU-sim"} 2.4e+09
# TYPE nvidia_smi_clocks_current_sm_clock_hz gauge
nvidia_smi_clocks_current_sm_clock_hz{uuid="GPU-sim"} 2.4e+09
# TYPE nvidia_smi_clocks_event_reasons_hw_slowdown gauge
nvidia_smi_clocks_event_reasons_hw_slowdown{uuid="GPU-sim"} 0
# TYPE nvidia_smi_clocks_event_reasons_hw_thermal_slowdown gauge
nvidia_smi_clocks_event_reasons_hw_thermal_slowdown{uuid="GPU-sim"} 0
# TYPE nvidia_smi_clocks_event_reasons_sw_thermal_slowdown gauge
nvidia_smi_clocks_event_reasons_sw_thermal_slowdown{uuid="GPU-sim"} 0
# TYPE nvidia_smi_clocks_event_reasons_hw_power_brake_slowdown gauge
nvidia_smi_clocks_event_reasons_hw_power_brake_slowdown{uuid="GPU-sim"} 0
# TYPE nvidia_smi_clocks_event_reasons_sw_power_cap gauge
nvidia_smi_clocks_event_reasons_sw_power_cap{uuid="GPU-sim"} 0
# TYPE nvidia_smi_gpu_info gauge
nvidia_smi_gpu_info{uuid="GPU-sim",name="NVIDIA GB10 (stand-in)",driver_version="0.0.0-sim"} 1
# TYPE nvidia_smi_last_collect_success gauge
nvidia_smi_last_collect_success 1
`

func main() {
	flag.Usage = func() { fmt.Fprint(os.Stderr, help); flag.PrintDefaults() }
	listen := flag.String("web.listen-address", ":9835", "address to serve /metrics on")
	fields := flag.String("query-field-names", "AUTO", "accepted for compatibility; only AUTO is meaningful here")
	flag.Parse()
	if flag.NArg() > 0 {
		log.Fatalf("gpu-exporter-standin: unexpected arguments %q", flag.Args())
	}
	if *fields != "AUTO" {
		log.Fatalf("gpu-exporter-standin: --query-field-names=%s: the stand-in serves the AUTO set only", *fields)
	}
	http.HandleFunc("/metrics", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4")
		fmt.Fprint(w, metrics)
	})
	log.Printf("gpu-exporter-standin (not nvidia_gpu_exporter): listening on %s", *listen)
	log.Fatal(http.ListenAndServe(*listen, nil))
}
