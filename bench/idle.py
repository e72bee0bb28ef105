"""What an idle node costs: the CPU time one Skulk node and its runners spend over a quiet
window with a model placed and nobody asking anything.

Starts one real node, places the built-in tiny GGUF model (served in the runner itself,
SKULK_BUNDLED_LLAMA_SERVER=0; with `--bundled`, by the bundled llama-server a fresh node
uses, whose process counts as one of the runner's descendants), waits until its runner is ready and a warm-up passes, then reads
the CPU time (user + system) of the node process and of every descendant (its runners)
across the window. CPU time, not a utilisation rate, so the figure holds on a loaded
machine; the load average is printed beside it as context. Nothing touches the node's API
during the window. The node's threads are listed by CPU time (kernel thread names: the
event loop is "main", zenoh's runtime threads are `rx-*`, `tx-*`, `net-*`, ...) with their
wake-ups (context switches) a second.

Everything it starts (the node, and through it the runners) is stopped on exit, and every
wait has a deadline.

Usage:
  uv run python bench/idle.py [--seconds 60] [--warmup 15] [--no-model] [--bundled]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.cluster.harness import agreed
from tests.nodeproc import NodeProcess, free_port, wait_for

MODEL = "local/tiny-llama-gguf"
NODE_ENV = {
    "SKULK_BUNDLED_LLAMA_SERVER": "0",  # serve the GGUF in the runner itself
    "SKULK_NO_ENGINE_AUTOPROVISION": "1",  # a background llama-server build is not idling
    "SKULK_LOG_LEVEL": "WARNING",
}
KEY = "bench-idle-key"
AGREE_DEADLINE_S = 60.0
PLACE_DEADLINE_S = 60.0
READY_DEADLINE_S = 180.0
"""Generating the tiny model and loading it in a fresh runner, on a loaded 2-core machine."""
SAMPLE_EVERY_S = 5.0
"""The window is read in steps this long, so a runner that exits mid-window keeps the CPU
it spent up to its last reading."""
LEFTOVER_KILL_S = 5.0


def cpu_s(process: psutil.Process) -> float:
    times = process.cpu_times()
    return times.user + times.system


def thread_readings(pid: int) -> dict[str, tuple[float, int]]:
    """(CPU seconds, context switches) per thread name, threads sharing a name summed; the
    main thread (the event loop) is "main". A context switch is roughly one wake-up of the
    thread. {} off Linux."""
    readings: dict[str, tuple[float, int]] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            name = "main" if task.name == str(pid) else (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
            status = dict(line.split(":\t", 1) for line in (task / "status").read_text().splitlines() if ":\t" in line)
        except OSError:
            continue  # the thread ended meanwhile
        spent = (int(fields[11]) + int(fields[12])) / tick  # utime, stime
        switches = int(status["voluntary_ctxt_switches"]) + int(status["nonvoluntary_ctxt_switches"])
        before = readings.get(name, (0.0, 0))
        readings[name] = (before[0] + spent, before[1] + switches)
    return readings


def place(node: NodeProcess) -> str:
    """Place MODEL, retrying the typed 503 a fresh node answers before its resources are in."""

    def attempt() -> httpx.Response | None:
        response = httpx.post(node.url + "/place_instance", json={"modelId": MODEL}, timeout=10)
        pending = response.status_code == 503 and response.json()["error"]["code"] == "placement_info_pending"
        return None if pending else response

    response = wait_for(attempt, timeout_s=PLACE_DEADLINE_S, interval_s=0.5, what="placement accepted")
    assert isinstance(response, httpx.Response)
    if response.status_code != 200:
        raise SystemExit(f"placement refused: {response.status_code} {response.text}")
    return response.json()["instanceId"]


def instance_ready(node: NodeProcess, instance_id: str) -> bool:
    response = node.get(f"/instance/{instance_id}")
    if response.status_code != 200:
        return False
    runners = response.json()["runners"].values()
    failed = [r for r in runners if r["state"] == "Failed"]
    if failed:
        raise SystemExit(f"runner failed: {failed}\n{node.log()[-3000:]}")
    return bool(runners) and all(r["state"] in ("Ready", "Running") for r in runners)


def start_node(root: Path, *, bundled: bool = False) -> NodeProcess:
    args = ["--listen", f"tcp/127.0.0.1:{free_port()}", "--cluster-key", KEY, "--node-name", "idle"]
    (root / "engines").mkdir()
    # An empty engines dir: a llama-server this machine built (`skulk engines install`) would
    # otherwise serve the model instead of the runner itself.
    node = NodeProcess(data_dir=root / "idle", api_port=free_port(), extra_args=args,
                       env={**NODE_ENV, "SKULK_ENGINES_DIR": str(root / "engines"),
                            "SKULK_BUNDLED_LLAMA_SERVER": "1" if bundled else "0"})
    return node.start()


def measure(node_pid: int, seconds: float) -> tuple[float, dict[int, float], dict[str, tuple[float, int]]]:
    """(node CPU s, CPU s per descendant pid, node (CPU s, context switches) per thread name)
    over `seconds`."""
    node = psutil.Process(node_pid)
    first: dict[int, float] = {}
    last: dict[int, float] = {}

    def read(initial: bool) -> None:
        for child in node.children(recursive=True):
            try:
                spent = cpu_s(child)
            except psutil.NoSuchProcess:
                continue
            first.setdefault(child.pid, spent if initial else 0.0)  # born in the window: all of it counts
            last[child.pid] = spent

    node_before, threads_before = cpu_s(node), thread_readings(node_pid)
    read(initial=True)
    end = time.monotonic() + seconds
    while (left := end - time.monotonic()) > 0:
        time.sleep(min(SAMPLE_EVERY_S, left))
        read(initial=False)
    node_spent = cpu_s(node) - node_before
    threads = {name: (spent - threads_before.get(name, (0.0, 0))[0], switches - threads_before.get(name, (0.0, 0))[1])
               for name, (spent, switches) in thread_readings(node_pid).items()}
    return node_spent, {pid: last[pid] - first[pid] for pid in last}, threads


def stop(node: NodeProcess) -> None:
    """Stop the node, then any descendant that outlived it (a runner exits on its own when its
    parent goes; this is the deadline on that)."""
    descendants: list[psutil.Process] = []
    if node.proc is not None and node.proc.poll() is None:
        try:
            descendants = psutil.Process(node.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            pass
    node.stop()
    _, alive = psutil.wait_procs(descendants, timeout=LEFTOVER_KILL_S)
    for process in alive:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=LEFTOVER_KILL_S)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="the measured window")
    parser.add_argument("--warmup", type=float, default=15.0, help="quiet time after the runner is ready")
    parser.add_argument("--no-model", action="store_true", help="measure a node with nothing placed")
    parser.add_argument("--bundled", action="store_true", help="serve the model with the bundled llama-server")
    parser.add_argument("--threads", type=int, default=8, help="node threads to list (0: none)")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # run the cleanup below

    with tempfile.TemporaryDirectory(prefix="skulk-idle-") as tmp:
        node = start_node(Path(tmp), bundled=args.bundled)
        assert node.proc is not None
        try:
            node.wait_ready()
            wait_for(lambda: agreed([node], members=1), timeout_s=AGREE_DEADLINE_S, interval_s=0.25,
                     what="the node elected itself")
            if not args.no_model:
                instance_id = place(node)
                wait_for(lambda: instance_ready(node, instance_id), timeout_s=READY_DEADLINE_S, interval_s=0.5,
                         what=f"instance {instance_id} ready")
            time.sleep(args.warmup)
            load_before = os.getloadavg()
            node_s, runners, threads = measure(node.proc.pid, args.seconds)
            load_after = os.getloadavg()
            if node.proc.poll() is not None:
                raise SystemExit(f"the node exited during the window:\n{node.log()[-3000:]}")
        finally:
            stop(node)

    def pct(spent_s: float) -> str:
        return f"{spent_s / args.seconds * 100:.3f}%"

    runner_s = sum(runners.values())
    what = "no model" if args.no_model else MODEL + " placed" + (", bundled llama-server" if args.bundled else "")
    print(f"idle node over {args.seconds:.0f} s ({what}), % of one core (CPU time / wall time):")
    print(f"  node     {pct(node_s)}  ({node_s * 1e3:.0f} ms)")
    for pid, spent in sorted(runners.items()):
        print(f"  runner   {pct(spent)}  ({spent * 1e3:.0f} ms, pid {pid})")
    print(f"  runners  {pct(runner_s)}")
    print(f"  total    {pct(node_s + runner_s)}")
    print(f"  load average before {load_before[0]:.2f}, after {load_after[0]:.2f} (1 min); "
          f"{psutil.cpu_count()} cores")
    if args.threads:
        print("  node threads by CPU time (CPU, wake-ups a second):")
        for name, (spent, switches) in sorted(threads.items(), key=lambda kv: (-kv[1][0], -kv[1][1]))[:args.threads]:
            print(f"    {name:<18} {pct(spent):>7}  {switches / args.seconds:6.1f}/s")


if __name__ == "__main__":
    main()
