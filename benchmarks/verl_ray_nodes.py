"""The multi-node recipe, rehearsed on one machine: verl's CPU run submitted to a two-node Ray cluster.

What the "across nodes with Ray" steps (docs/guides/verl.md) do on real machines, here with both nodes on this one:

  1. a head node, ``ray start --head --num-gpus 1 ...`` (on the CPU, one logical GPU per FSDP worker: what
     ``setpo.verl.cpu``'s platform places its workers on), its dashboard on 127.0.0.1;
  2. a second node, ``ray start --address <head>:<port> --num-gpus 1 ...``: its own raylet with its own ports
     (what ``ray.cluster_utils.Cluster`` does in Ray's tests), everything on the loopback address;
  3. the CPU demo's run (``python -m setpo.verl cpu-demo``: the tiny Countdown Qwen2, SetPO+GRPO, hashed
     n-gram embedder) for ``STEPS`` steps with ``--nnodes 2 --n-gpus-per-node 1``, sent with
     ``ray job submit`` to the head's dashboard; the launcher joins the cluster through ``RAY_ADDRESS``, which
     Ray sets for a job's entrypoint;
  4. where verl's workers ran, from Ray's own state API (``ray.util.state.list_actors`` / ``list_nodes``):
     the FSDP workers and the rollout servers must sit on both node ids;
  5. the nodes stopped.

``ray stop`` stops every Ray process on a machine (Ray 2.60's ``ray stop`` has no address or node option),
which on a shared machine would also kill other people's runs; step 5 does what ``ray stop`` does (SIGTERM,
a grace period, SIGKILL) to exactly the processes of the two ``ray start`` commands, each the leader of its
own process session, and checks that none is left, pass or fail. ``--ray-stop`` runs the real ``ray stop``
afterwards, for a machine where nothing else uses Ray. Each ``ray start`` runs with ``--block`` and dies
with this script (``PR_SET_PDEATHSIG``), so Ray's own reaper takes its node down if this script is killed.

Token authentication (Ray's default for a new head when a token exists) is set explicitly: a fresh token in
the run's folder (``RAY_AUTH_TOKEN_PATH``) and ``RAY_AUTH_MODE=token`` for every node, the job client and the
state API, as on a real cluster, where the same token file goes to every node.

Writes ``runs/bench/verl_ray_nodes.json`` (times, nodes, actors with their node ids, the job's status) and
``.md``. ``python benchmarks/verl_ray_nodes.py [--smoke] [--out DIR] [--ray-stop]``; about 3-5 min on 2 cores.
The full run is already the least that shows the recipe (two nodes, two steps, a checkpoint): ``--smoke`` runs the
same and only writes to the smoke folder; tests/test_verl_ray_nodes.py runs it in ``make test``.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STEPS = 2
NODES = 2
#: logical CPUs per node: one FSDP worker's bundle asks 3 (verl's max_colocate_count), plus the task runner,
#: the rollout's agent loop, the reward loop and TransferQueue's actors (1 each, on whichever node has room).
NODE_CPUS = 8
#: the per-node ports ``ray start`` would otherwise take from Ray's defaults (shared by every node of a machine)
PORT_OPTIONS = ("--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port",
                "--dashboard-agent-grpc-port", "--runtime-env-agent-port", "--metrics-export-port")
HEAD_PORT_OPTIONS = ("--port", "--dashboard-port", "--ray-client-server-port")
WORKER_PORTS = 40  # each node's range for its worker processes (--min/--max-worker-port)


def free_ports(n: int) -> list[int]:
    """``n`` distinct ports that are free on 127.0.0.1 now (bound, read, released together)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def free_port_range(width: int, avoid: set[int], lo: int = 20000, hi: int = 30000) -> int:
    """The first port of ``width`` consecutive ports on 127.0.0.1 that are free now and not in ``avoid``."""
    start = lo + secrets.randbelow((hi - lo) // width) * width
    for base in list(range(start, hi - width, width)) + list(range(lo, start, width)):
        ports = range(base, base + width)
        if avoid.intersection(ports):
            continue
        try:
            socks = []
            for p in ports:
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", p))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {width} consecutive free ports between {lo} and {hi}")


def _die_with_parent() -> None:
    """In the child before exec: SIGKILL when the process that started it dies (Linux prctl)."""
    try:
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass


def session_pids(sid: int) -> list[int]:
    from setpo.verl.cpu_demo import session_pids as live

    return live(sid)


class RayNodes:
    """A Ray head and worker nodes on 127.0.0.1, each ``ray start --block`` the leader of its own session."""

    def __init__(self, folder: Path, nodes: int = NODES, cpus: int = NODE_CPUS, gpus: int = 1):
        self.folder, self.nodes, self.cpus, self.gpus = folder, nodes, cpus, gpus
        self.procs: list[subprocess.Popen] = []
        token = folder / "auth_token"
        token.write_text(secrets.token_hex(32))
        token.chmod(0o600)
        self.env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token),
                    "RAY_USAGE_STATS_ENABLED": "0", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
                    "TOKENIZERS_PARALLELISM": "false", "RAY_DEDUP_LOGS": "1", "PYTHONUNBUFFERED": "1"}
        self.env.pop("RAY_ADDRESS", None)
        ports = free_ports(len(HEAD_PORT_OPTIONS) + nodes * len(PORT_OPTIONS))
        self.head_ports = dict(zip(HEAD_PORT_OPTIONS, ports, strict=False))  # the first of the ports
        rest = ports[len(HEAD_PORT_OPTIONS):]
        self.node_ports = [dict(zip(PORT_OPTIONS, rest[i * len(PORT_OPTIONS):(i + 1) * len(PORT_OPTIONS)], strict=True))
                           for i in range(nodes)]
        taken = set(ports)
        for p in self.node_ports:
            base = free_port_range(WORKER_PORTS, taken)
            taken.update(range(base, base + WORKER_PORTS))
            p["--min-worker-port"], p["--max-worker-port"] = base, base + WORKER_PORTS - 1
        self.gcs_address = f"127.0.0.1:{self.head_ports['--port']}"
        self.dashboard = f"http://127.0.0.1:{self.head_ports['--dashboard-port']}"
        self.commands: list[list[str]] = []

    def _ray(self) -> list[str]:
        exe = Path(sys.executable).with_name("ray")
        return [str(exe)] if exe.is_file() else [sys.executable, "-m", "ray.scripts.scripts"]

    def node_command(self, i: int) -> list[str]:
        common = [f"--num-cpus={self.cpus}", f"--num-gpus={self.gpus}",
                  "--disable-usage-stats", "--block", *(f"{k}={v}" for k, v in self.node_ports[i].items())]
        if i == 0:
            return [*self._ray(), "start", "--head", *(f"{k}={v}" for k, v in self.head_ports.items()),
                    "--dashboard-host=127.0.0.1", "--include-dashboard=true",
                    f"--temp-dir={self.folder / 'ray'}", *common]
        return [*self._ray(), "start", f"--address={self.gcs_address}", *common]

    def start(self, timeout: float = 180.0) -> float:
        """Start the head, then the other nodes; return the seconds until all of them were alive."""
        t0 = time.perf_counter()
        for i in range(self.nodes):
            cmd = self.node_command(i)
            self.commands.append(cmd)
            log = open(self.folder / f"node{i}.log", "w")  # noqa: SIM115 - open for the process's life
            self.procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=self.env,
                                               cwd=self.folder, start_new_session=True,
                                               preexec_fn=_die_with_parent))
            self._wait_started(i, t0 + timeout)
        while len(self.alive_nodes()) < self.nodes:  # Ray's own view: every node registered and alive
            if time.perf_counter() > t0 + timeout:
                raise RuntimeError(f"{self.nodes} Ray nodes not alive in {timeout:.0f} s; logs in {self.folder}")
            time.sleep(2)
        return time.perf_counter() - t0

    def _wait_started(self, i: int, deadline: float) -> None:
        """Until ``ray start`` of node ``i`` says its node runs (what it prints before blocking)."""
        log = self.folder / f"node{i}.log"
        while time.perf_counter() < deadline:
            if self.procs[i].poll() is not None:
                raise RuntimeError(f"`ray start` of node {i} exited with {self.procs[i].returncode}:\n"
                                   + log.read_text()[-3000:])
            if "Ray runtime started" in log.read_text():
                return
            time.sleep(1)
        raise RuntimeError(f"`ray start` of node {i} did not start in time; its log: {log}")

    def state(self, kind: str, *filters: str, timeout: float = 60.0) -> list[dict]:
        """``ray list <kind> --detail --format json`` against the head: Ray's state API (``ray.util.state``),
        run in its own process with the cluster's auth settings (a Ray already imported here keeps its own)."""
        cmd = [*self._ray(), "list", kind, f"--address={self.dashboard}", "--detail", "--format=json",
               "--limit=10000", *(f"--filter={f}" for f in filters)]
        r = subprocess.run(cmd, capture_output=True, text=True, env=self.env, timeout=timeout, cwd=self.folder)
        if r.returncode:
            raise RuntimeError(f"`ray list {kind}` failed ({r.returncode}): {r.stderr[-2000:]}")
        return json.loads(r.stdout)

    def alive_nodes(self) -> list[dict]:
        return self.state("nodes", "state=ALIVE", timeout=30)

    def pids(self) -> list[int]:
        return sorted(pid for p in self.procs for pid in session_pids(p.pid))

    def stop(self, grace_s: float = 15.0) -> list[int]:
        """What ``ray stop`` does (SIGTERM, ``grace_s``, SIGKILL), to these nodes' processes only; the pids still
        alive after it (none, or it failed)."""
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
            for pid in self.pids():
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.time() + wait
            while self.pids() and time.time() < deadline:
                time.sleep(0.5)
            for p in self.procs:
                try:
                    p.wait(timeout=0.1)
                except subprocess.TimeoutExpired:
                    pass
            if not self.pids():
                break
        return self.pids()


def job_command(demo: dict, out: Path) -> list[str]:
    """The CPU demo's training command for two nodes of one worker each, ``STEPS`` steps, a checkpoint at the end."""
    from setpo.verl.cpu_demo import cpu_demo_command

    cmd = cpu_demo_command(demo, str(out))
    cmd[0] = sys.executable
    for flag, value in (("--total-steps", STEPS), ("--test-freq", -1), ("--save-freq", STEPS)):
        cmd[cmd.index(flag) + 1] = str(value)
    return [*cmd, "--nnodes", str(NODES), "--n-gpus-per-node", "1", "--experiment-name", "ray_nodes",
            "--logger", "console,file", "trainer.val_before_train=false"]


def placement(nodes: RayNodes, job_id: str) -> dict:
    """The job's actors from Ray's state API, each with its node id, and the cluster's nodes."""
    listed, actors = nodes.state("nodes"), nodes.state("actors", f"job_id={job_id}")
    node_rows = [{"node_id": n["node_id"], "ip": n["node_ip"], "head": bool(n["is_head_node"]), "state": n["state"],
                  "GPU": n["resources_total"].get("GPU"), "CPU": n["resources_total"].get("CPU")} for n in listed]
    actor_rows = sorted(({"class": a["class_name"], "name": a.get("name") or "", "node_id": a["node_id"],
                          "pid": a.get("pid"), "state": a["state"]} for a in actors),
                        key=lambda r: (r["class"], r["name"], r["node_id"]))
    by_class: dict[str, list[str]] = {}
    for a in actor_rows:
        by_class.setdefault(a["class"], []).append(a["node_id"])
    return {"nodes": node_rows, "actors": actor_rows,
            "nodes_by_class": {k: sorted(set(v)) for k, v in by_class.items()}}


#: verl's FSDP workers (all roles fused in one Ray actor class) and this project's rollout servers
WORKER_CLASS_HINTS = ("WorkerDict", "ActorRolloutRef")
SERVER_CLASS = "HFGenerationServer"


def worker_nodes(place: dict) -> list[str]:
    """Node ids of verl's FSDP worker actors."""
    ids = set()
    for cls, nodes in place["nodes_by_class"].items():
        if any(h in cls for h in WORKER_CLASS_HINTS):
            ids.update(nodes)
    return sorted(ids)


def rehearse(out_dir: Path, ray_stop: bool = False, timeout_s: float = 540.0, pid_file: Path | None = None) -> dict:
    """Steps 1-5 above; the record of it (raises RuntimeError when a step fails, after stopping the nodes)."""
    from setpo.verl.cpu_demo import write_countdown_demo
    from setpo.verl.launch import METRICS_FILE

    t_all = time.perf_counter()
    record: dict = {"steps": STEPS, "nodes": NODES}
    with tempfile.TemporaryDirectory(prefix="verl_ray_nodes_") as tmp:
        tmp = Path(tmp)
        demo = write_countdown_demo(tmp / "demo")
        nodes = RayNodes(tmp)
        error = None
        try:
            try:
                record["start_s"] = nodes.start()
            finally:
                if pid_file is not None:  # whoever runs this can sweep these sessions if it is killed
                    pid_file.write_text(json.dumps([p.pid for p in nodes.procs]))
            record["ray_start"] = [shlex.join(c) for c in nodes.commands]
            cmd = job_command(demo, tmp / "runs")
            submission_id = f"setpo_ray_nodes_{secrets.token_hex(4)}"
            submit = [*nodes._ray(), "job", "submit", f"--address={nodes.dashboard}",
                      f"--submission-id={submission_id}", "--", *cmd]
            record["ray_job_submit"] = shlex.join(submit)
            t0 = time.perf_counter()
            with open(tmp / "submit.log", "w") as log:
                try:
                    rc = subprocess.run(submit, stdout=log, stderr=subprocess.STDOUT, env=nodes.env, cwd=tmp,
                                        timeout=timeout_s).returncode
                except subprocess.TimeoutExpired:
                    rc = None
            record["job_s"] = time.perf_counter() - t0
            job = nodes.state("jobs", f"submission_id={submission_id}")[0]
            record["job_status"], record["job_id"] = job["status"], job["job_id"]
            output = (tmp / "submit.log").read_text()
            record["job_log_tail"] = output[-3000:]
            if rc is None or job["status"] != "SUCCEEDED":
                raise RuntimeError(f"the job did not succeed (submit exit {rc}, status {record['job_status']}):\n"
                                   + output[-4000:])
            run_dir = tmp / "runs" / "ray_nodes"
            metrics = [json.loads(x) for x in (run_dir / METRICS_FILE).read_text().splitlines() if x.strip()]
            record["metric_steps"] = sorted(r["step"] for r in metrics)
            record["setpo_metrics_every_step"] = all("setpo/s_mean" in r["data"] for r in metrics)
            record["step_s"] = [round(r["data"]["timing_s/step"], 2) for r in sorted(metrics, key=lambda r: r["step"])]
            ckpt = run_dir / "checkpoints"
            record["checkpoint"] = (ckpt / "latest_checkpointed_iteration.txt").read_text().strip()
            record["placement"] = place = placement(nodes, job["job_id"])
            record["worker_node_ids"] = worker_nodes(place)
            record["server_node_ids"] = place["nodes_by_class"].get(SERVER_CLASS, [])
        except Exception as err:  # noqa: BLE001 - the nodes are stopped first, then it is raised
            error = err
        finally:
            t0 = time.perf_counter()
            record["left_after_stop"] = nodes.stop()
            if ray_stop:
                stop = subprocess.run([*nodes._ray(), "stop"], capture_output=True, text=True, env=nodes.env)
                record["ray_stop"] = stop.stdout[-1000:] + stop.stderr[-1000:]
            record["stop_s"] = time.perf_counter() - t0
        if error is not None:
            raise RuntimeError(f"{error}\n(nodes stopped; left: {record['left_after_stop']})") from error
    record["total_s"] = time.perf_counter() - t_all
    node_ids = sorted(n["node_id"] for n in record["placement"]["nodes"] if n["state"] == "ALIVE")
    record["two_nodes_used"] = len(node_ids) == NODES and record["worker_node_ids"] == node_ids
    return record


def markdown(r: dict) -> str:
    nodes = sorted(r["placement"]["nodes"], key=lambda n: not n["head"])  # the head first, then node 1, 2, ...
    ids = {n["node_id"]: ("head" if n["head"] else f"node {i}") for i, n in enumerate(nodes)}
    rows = [{"actor": a["class"] + (f" ({a['name']})" if a["name"] else ""), "node": ids.get(a["node_id"], "?"),
             "node id": a["node_id"][:12], "pid": a["pid"]} for a in r["placement"]["actors"]]
    from setpo.records import markdown_table

    return "\n".join([
        f"verl's CPU run (tiny Qwen2, Countdown, SetPO+GRPO, {r['steps']} steps) submitted with `ray job submit` "
        f"to {r['nodes']} Ray nodes started with `ray start` on this machine (one logical GPU = one FSDP worker each; "
        f"node IPs {sorted({n['ip'] for n in r['placement']['nodes']})}, dashboard on 127.0.0.1).",
        "",
        f"Nodes up in {r['start_s']:.0f} s, the job in {r['job_s']:.0f} s (status {r['job_status']}, steps "
        f"{r['metric_steps']}, step times {r['step_s']} s, checkpoint at step {r['checkpoint']}), nodes stopped "
        f"in {r['stop_s']:.0f} s with {len(r['left_after_stop'])} process(es) left; {r['total_s']:.0f} s in all.",
        f"FSDP workers on {len(r['worker_node_ids'])} node(s), rollout servers on {len(r['server_node_ids'])}.",
        "", "Where Ray placed the job's actors (`ray.util.state.list_actors`):", "", markdown_table(rows)])


def _options(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--ray-stop", action="store_true",
                    help="also run `ray stop` at the end (it stops EVERY Ray process on this machine)")
    ap.add_argument("--pid-file", default=None, help="write the `ray start` session ids here once started")


def main(argv=None) -> dict:
    from harness import options, report

    args = options(__doc__, argv, _options)
    import importlib.util

    missing = [m for m in ("verl", "ray", "transfer_queue") if importlib.util.find_spec(m) is None]
    if missing:  # `make bench` in an install without verl's extra
        print(f"verl_ray_nodes: skipped, not installed: {', '.join(missing)} (pip install -e '.[verl]')")
        return {}
    record = rehearse(args.out, ray_stop=args.ray_stop, pid_file=Path(args.pid_file) if args.pid_file else None)
    report(args, "verl_ray_nodes", markdown(record), record)
    if not record["two_nodes_used"] or record["left_after_stop"]:
        raise SystemExit(f"workers on {record['worker_node_ids']}, left after stop: {record['left_after_stop']}")
    return record


if __name__ == "__main__":
    main()
