"""A lane's swap (issue 41 part 3): launch/lane-drain.sh against a stand-in engine's /metrics. Paced
(tests/marker_lists.py): its deadlines are seconds on the clock."""

import pytest


class Gauge:
    """vLLM's running-requests gauge as /metrics shows it, counting down one per scrape to `floor`."""

    def __init__(self, start: int, floor: int = 0):
        self.value, self.floor = start, floor

    def serve(self):
        import http.server
        import threading

        gauge = self

        class Metrics(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = (f'vllm:num_requests_running{{engine="0",model_name="m"}} {gauge.value}.0\n'
                        'vllm:num_requests_waiting{engine="0",model_name="m"} 0.0\n').encode()
                gauge.value = max(gauge.floor, gauge.value - 1)
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Metrics)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server


def lane_drain(*args):
    import subprocess

    from toolbox import LAUNCH_DIR

    return subprocess.run(["bash", str(LAUNCH_DIR / "lane-drain.sh"), *args], capture_output=True, text=True,
                          timeout=60)


@pytest.mark.parametrize("start, floor, deadline_s, says", [
    (2, 0, 20, "drained: no request running"),  # the running streams end: the swap goes on at once
    (1, 1, 2, "deadline: 1 still running after 2 s; the swap goes on"),  # one never ends
])
def test_a_drain_turns_new_requests_away_and_waits_for_the_running_ones(tmp_path, start, floor, deadline_s, says):
    server = Gauge(start, floor).serve()
    drain_file = tmp_path / "drain" / "draining"
    try:
        done = lane_drain("drain", "--node", "sim2", "--drain-file", str(drain_file), "--deadline-s", str(deadline_s),
                          "--metrics-url", f"http://127.0.0.1:{server.server_address[1]}/metrics")
    finally:
        server.shutdown()
    assert done.returncode == 0 and says in done.stdout + done.stderr, done.stdout + done.stderr
    assert drain_file.read_text().startswith("swap: ")  # the lane's gateway answers 503 while it is there
    opened = lane_drain("open", "--node", "sim2", "--drain-file", str(drain_file))
    assert opened.returncode == 0 and not drain_file.exists(), opened.stderr


def test_an_engine_that_does_not_answer_has_nothing_to_drain(tmp_path):
    from toolbox import free_port

    drain_file = tmp_path / "draining"
    done = lane_drain("drain", "--node", "sim2", "--drain-file", str(drain_file), "--deadline-s", "2",
                      "--metrics-url", f"http://127.0.0.1:{free_port()}/metrics")
    assert done.returncode == 0 and "nothing to drain" in done.stdout + done.stderr and not drain_file.exists()
    bad = lane_drain("drain", "--node", "sim2", "--drain-file", str(drain_file), "--deadline-s", "soon",
                     "--metrics-url", "http://127.0.0.1:1/metrics")
    assert bad.returncode != 0 and "--deadline-s must be whole seconds, not 'soon'" in bad.stderr
