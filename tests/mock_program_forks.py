"""The program under mocks, forked: a process that has imported what every run of
tests/mock_program.py imports first (Pulumi's SDK, its mocks and the three providers' SDKs: ~0.9
of a run's ~1.4 CPU-s) and forks one child per run, which runs mock_program.py as a fresh
process would: its own arguments, environment, working directory, stdout and stderr (files).
Nothing of twinspark is imported here: each child imports the program anew.

tests/program_harness.py starts two per test process, which take its runs in turn (`ProgramForks`:
a child has this process's hash seed), and speaks JSON lines on their stdin and stdout. A request:
{"argv", "env", "cwd", "stdout", "stderr"}; the answers: {"pid": child} at once, then
{"status": exit status} when the child has ended.
"""
import json
import os
import runpy
import sys
import traceback

import pulumi  # noqa: F401  (the imports this process is for)
import pulumi_command  # noqa: F401
import pulumi_docker  # noqa: F401
import pulumi_random  # noqa: F401
from pulumi.runtime import mocks  # noqa: F401
from pulumi.runtime.proto import resource_pb2  # noqa: F401
from pulumi.runtime.stack import wait_for_rpcs  # noqa: F401


def run_child(request: dict) -> None:
    """In the forked child: become the run mock_program.py would be as a process of its own. Never returns."""
    status = 1
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        stdin = os.open(os.devnull, os.O_RDONLY)
        os.dup2(stdin, 0)
        for fd, path in ((1, request["stdout"]), (2, request["stderr"])):
            target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            os.dup2(target, fd)
            os.close(target)
        sys.argv = list(request["argv"])
        sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))  # a script's own folder, as Python puts it there
        try:
            runpy.run_path(sys.argv[0], run_name="__main__")
            status = 0
        except SystemExit as exit_:
            status = exit_.code if isinstance(exit_.code, int) else (0 if exit_.code is None else 1)
    except BaseException:  # noqa: BLE001 — whatever the run raised is its stderr, as a process's would be
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        os._exit(status)


def answer(message: dict, out) -> None:
    out.write(json.dumps(message) + "\n")
    out.flush()


def main() -> None:
    # the answers go to a duplicate of stdout: a child's fd 1 becomes its own file
    answers = os.fdopen(os.dup(1), "w")
    for line in sys.stdin:
        request = json.loads(line)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            answers.close()
            run_child(request)
        answer({"pid": pid}, answers)
        _, wait_status = os.waitpid(pid, 0)
        answer({"status": os.waitstatus_to_exitcode(wait_status)}, answers)


if __name__ == "__main__":
    main()
