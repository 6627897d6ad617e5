#!/usr/bin/python3
"""berth-executor-python: a Berth executor plugin written in Python.

It runs every stage of a job as a shell process on this host, in a build
directory per runner, slot and project, the way Berth's shell executor does,
and serves Berth's executor plugin protocol (executor.proto) over gRPC
through hashicorp/go-plugin's handshake. It exists to show that an executor
can live outside the runner manager, in another language, and pass the same
conformance suite as the built-in executors.

Stubs: generate executor_pb2.py and executor_pb2_grpc.py next to this file
(or anywhere on PYTHONPATH) from the protocol's definition:

    python3 -m grpc_tools.protoc -I executor/plugin/internal/pb \\
        --python_out=DIR --grpc_python_out=DIR executor.proto

Configuration ([runners.plugin.config]), every key optional:

    builds_dir  default builds directory (the runner's builds_dir wins)
    cache_dir   default cache directory (the runner's cache_dir wins)
    kill_grace  seconds between SIGTERM and SIGKILL of a stopped stage (10)
    helper      the berth binary stages use as the helper (default: the
                runner manager's own, which it offers in Describe)
"""

import datetime
import json
import os
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from concurrent import futures

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import grpc  # noqa: E402  (Debian: python3-grpcio)
import executor_pb2 as pb  # noqa: E402
import executor_pb2_grpc as pbg  # noqa: E402

NAME = "berth-executor-python"
VERSION = "1.0.0"
PROTOCOL_VERSION = 1
CORE_PROTOCOL_VERSION = 1  # hashicorp/go-plugin's
MAGIC_COOKIE_KEY = "BERTH_EXECUTOR_PLUGIN"
MAGIC_COOKIE_VALUE = "eff7eca1-2d15-4b94-8aa8-0bbe64abd02a"
MARKER_ENV = "BERTH_PYTHON_PLUGIN_STAGE"
CONFIG_KEYS = {"builds_dir", "cache_dir", "kill_grace", "helper"}


# --- logging: hclog JSON lines on stderr, which the runner manager relays --

_log_lock = threading.Lock()


def log(level, message, **attrs):
    line = {"@level": level, "@message": message,
            "@timestamp": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")}
    line.update(attrs)
    with _log_lock:
        sys.stderr.write(json.dumps(line) + "\n")
        sys.stderr.flush()


# --- processes: a stage's group, and processes that escaped it ------------

def marked_processes(prefix):
    """Pids of processes whose environment carries MARKER_ENV=<prefix>…"""
    needle = (MARKER_ENV + "=" + prefix).encode()
    pids = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open("/proc/%s/environ" % name, "rb") as f:
                env = f.read()
        except OSError:
            continue
        for entry in env.split(b"\0"):
            if entry.startswith(needle):
                pids.append(int(name))
                break
    return pids


def signal_marked(prefix, sig):
    n = 0
    for pid in marked_processes(prefix):
        try:
            os.kill(pid, sig)
            n += 1
        except OSError:
            pass
    return n


def signal_group(pgid, sig):
    try:
        os.killpg(pgid, sig)
    except OSError:
        pass


def kill_stage(pgid, marker):
    """SIGKILL a stage's group and everything carrying its marker, until
    nothing is left (a process may fork while it is being killed)."""
    signal_group(pgid, signal.SIGKILL)
    for _ in range(50):
        if signal_marked(marker, signal.SIGKILL) == 0:
            return
        time.sleep(0.02)


def safe_name(s):
    return "".join(c if c.isalnum() or c in "_-" else "_" for c in s)


def scope_of(system_id, short_token):
    if not system_id or not short_token:
        return ""
    return safe_name(system_id) + "." + safe_name(short_token)


# --- executors ------------------------------------------------------------

class Failure(Exception):
    def __init__(self, kind, message):
        super().__init__(message)
        self.kind = kind
        self.message = message

    def pb(self):
        return pb.Failure(kind=self.kind, message=self.message)


class Executor:
    def __init__(self):
        self.lock = threading.Lock()
        self.state = "created"
        self.env = None
        self.scope = ""
        self.stages = {}  # pgid → marker of running stages


class Plugin(pbg.ExecutorServicer):
    def __init__(self):
        self.lock = threading.Lock()
        self.config = None
        self.raw_config = None
        self.helper = ""
        self.executors = {}
        self.next_id = 0

    # Describe configures the plugin and says what it offers.
    def Describe(self, request, context):
        raw = bytes(request.config) or b"{}"
        try:
            cfg = json.loads(raw)
            if not isinstance(cfg, dict):
                raise ValueError("not a JSON object")
        except ValueError as e:
            return pb.DescribeResponse(failure=pb.Failure(kind=pb.Failure.CONFIG, message="configuration: %s" % e))
        unknown = sorted(set(cfg) - CONFIG_KEYS)
        if unknown:
            return pb.DescribeResponse(failure=pb.Failure(
                kind=pb.Failure.CONFIG, message="unknown configuration key(s): %s (known: %s)" % (", ".join(unknown), ", ".join(sorted(CONFIG_KEYS)))))
        try:
            float(cfg.get("kill_grace", 10))
        except (TypeError, ValueError):
            return pb.DescribeResponse(failure=pb.Failure(kind=pb.Failure.CONFIG, message="kill_grace: want seconds, got %r" % cfg["kill_grace"]))
        with self.lock:
            if self.raw_config is not None and self.raw_config != raw:
                return pb.DescribeResponse(failure=pb.Failure(kind=pb.Failure.CONFIG, message="already configured with another configuration"))
            self.config, self.raw_config = cfg, raw
            self.helper = cfg.get("helper") or request.helper
        log("info", "configured", runner=request.runner_name, host_version=request.host_version)
        return pb.DescribeResponse(
            name=NAME, version=VERSION, protocol_versions=[PROTOCOL_VERSION],
            executor="python", shell="bash" if shutil.which("bash") else "sh",
            features={"shared": True}, isolation_levels=["none"], capabilities=["sweep"])

    def Create(self, request, context):
        with self.lock:
            if self.config is None:
                return pb.CreateResponse(failure=pb.Failure(kind=pb.Failure.SYSTEM, message="Describe must come first"))
            self.next_id += 1
            eid = "py%d" % self.next_id
            self.executors[eid] = Executor()
        return pb.CreateResponse(executor_id=eid)

    def lookup(self, eid):
        with self.lock:
            ex = self.executors.get(eid)
        if ex is None:
            raise Failure(pb.Failure.NOT_PREPARED, "executor %r is unknown to this plugin process" % eid)
        return ex

    def Prepare(self, request, context):
        try:
            ex = self.lookup(request.executor_id)
            with ex.lock:
                if ex.state != "created":
                    raise Failure(pb.Failure.SYSTEM, "prepare: executor already %s" % ex.state)
                ex.state = "failed"  # until it succeeds
            env = self.prepare(request)
        except Failure as f:
            yield pb.PrepareEvent(failure=f.pb())
            return
        except OSError as e:
            yield pb.PrepareEvent(failure=pb.Failure(kind=pb.Failure.SYSTEM, message="preparing: %s" % e))
            return
        if not context.is_active():
            yield pb.PrepareEvent(failure=pb.Failure(kind=pb.Failure.CANCELED, message="preparing: canceled"))
            return
        with ex.lock:
            if ex.state != "failed":
                yield pb.PrepareEvent(failure=pb.Failure(kind=pb.Failure.SYSTEM, message="prepare: executor %s meanwhile" % ex.state))
                return
            ex.state, ex.env = "prepared", env
            ex.scope = scope_of(request.system_id, request.short_token)
        yield pb.PrepareEvent(output=("Using the Python executor plugin %s (%s) on %s...\n" % (VERSION, env.shell, env.hostname)).encode())
        yield pb.PrepareEvent(environment=env)

    def prepare(self, r):
        project = r.project_path
        parts = project.split("/")
        if not project or project.startswith("/") or any(p in ("", ".", "..") for p in parts) or any(c in project for c in "\\\n\r\0"):
            raise Failure(pb.Failure.SYSTEM, "project path %r: must be relative without empty, . or .. parts" % project)
        short = r.short_token
        if not short or "/" in short or "\\" in short or short in (".", ".."):
            raise Failure(pb.Failure.SYSTEM, "short token %r: not usable in a path" % short)
        if r.concurrency_id < 0:
            raise Failure(pb.Failure.SYSTEM, "concurrency id %d: must not be negative" % r.concurrency_id)
        if r.shell not in ("", "bash", "sh"):
            raise Failure(pb.Failure.SYSTEM, "shell %r is not supported (bash or sh)" % r.shell)
        cfg = self.config
        builds = os.path.abspath(r.builds_dir or cfg.get("builds_dir") or os.path.join(os.getcwd(), "builds"))
        cache = os.path.abspath(r.cache_dir or cfg.get("cache_dir") or os.path.join(os.getcwd(), "cache"))
        build_dir = os.path.join(builds, short, str(r.concurrency_id), *parts)
        tmp_dir = build_dir + ".tmp"
        os.makedirs(build_dir, exist_ok=True)
        os.makedirs(cache, exist_ok=True)
        shutil.rmtree(tmp_dir, ignore_errors=True)
        os.makedirs(tmp_dir, mode=0o700)
        shell = "bash" if r.shell in ("", "bash") and shutil.which("bash") else "sh"
        if not self.helper:
            raise Failure(pb.Failure.SYSTEM, "no helper: set helper in [runners.plugin.config]")
        return pb.Environment(build_dir=build_dir, tmp_dir=tmp_dir, cache_dir=cache, shell=shell,
                              helper=self.helper, hostname=os.uname().nodename)

    def Run(self, request_iterator, context):
        try:
            first = next(request_iterator)
        except StopIteration:
            return
        if not first.HasField("start"):
            yield pb.RunEvent(failure=pb.Failure(kind=pb.Failure.SYSTEM, message="protocol: the first message of Run must be start"))
            return
        start = first.start
        try:
            ex = self.lookup(start.executor_id)
        except Failure as f:
            yield pb.RunEvent(failure=f.pb())
            return
        with ex.lock:
            if ex.state != "prepared":
                yield pb.RunEvent(failure=pb.Failure(kind=pb.Failure.NOT_PREPARED, message="stage %s: executor is %s" % (start.stage, ex.state)))
                return
            env = ex.env
        yield from self.run_stage(ex, env, start, request_iterator, context)

    def run_stage(self, ex, env, start, request_iterator, context):
        script = os.path.join(env.tmp_dir, "stage-%s-%s.sh" % (safe_name(start.stage), uuid.uuid4().hex[:8]))
        with open(script, "w") as f:
            f.write(start.script)
        args = [env.shell, "--noprofile", "--norc", script] if env.shell == "bash" else [env.shell, script]
        marker = "%s:%s" % (ex.scope, uuid.uuid4().hex)
        child_env = dict(os.environ)
        child_env[MARKER_ENV] = marker
        for k in (MAGIC_COOKIE_KEY, "PLUGIN_PROTOCOL_VERSIONS", "PLUGIN_MIN_PORT", "PLUGIN_MAX_PORT", "PLUGIN_CLIENT_CERT"):
            child_env.pop(k, None)
        rfd, wfd = os.pipe()
        try:
            # Its own session and process group; the marker finds what
            # leaves them.
            proc = subprocess.Popen(args, cwd=env.build_dir, env=child_env, stdin=subprocess.DEVNULL,
                                    stdout=wfd, stderr=wfd, start_new_session=True)
        except OSError as e:
            os.close(rfd)
            os.close(wfd)
            os.unlink(script)
            yield pb.RunEvent(failure=pb.Failure(kind=pb.Failure.SYSTEM, message="stage %s: starting %s: %s" % (start.stage, env.shell, e)))
            return
        os.close(wfd)
        pid = proc.pid
        pgid = pid
        with ex.lock:
            ex.stages[pgid] = marker

        events = queue.Queue()
        canceled = threading.Event()
        reason = ["canceled"]
        exited = threading.Event()
        grace = float(self.config.get("kill_grace", 10))

        def reader():
            while True:
                try:
                    b = os.read(rfd, 32768)
                except OSError:
                    b = b""
                if not b:
                    events.put(("eof", None))
                    return
                events.put(("out", b))

        def waiter():
            code = proc.wait()
            exited.set()
            events.put(("exit", code))

        def stopper():
            # A cancel message, the host's input ending or the call going
            # away all stop the stage: SIGTERM, then SIGKILL after the grace.
            try:
                for msg in request_iterator:
                    if msg.HasField("cancel"):
                        reason[0] = msg.cancel.reason or "canceled"
                        break
            except grpc.RpcError:
                reason[0] = "the runner manager went away"
            if exited.is_set():
                return
            canceled.set()
            log("info", "stopping stage", stage=start.stage, reason=reason[0])
            signal_group(pgid, signal.SIGTERM)
            signal_marked(marker, signal.SIGTERM)
            if not exited.wait(grace):
                signal_group(pgid, signal.SIGKILL)

        threading.Thread(target=reader, daemon=True).start()
        threading.Thread(target=waiter, daemon=True).start()
        threading.Thread(target=stopper, daemon=True).start()

        status = None
        eof = False
        drain_deadline = None
        try:
            while not (eof and status is not None):
                timeout = None
                if status is not None:
                    if drain_deadline is None:
                        # Whatever the stage left behind goes with it, so
                        # that nothing holds the output pipe open.
                        kill_stage(pgid, marker)
                        drain_deadline = time.monotonic() + 5
                    timeout = max(0, drain_deadline - time.monotonic())
                try:
                    kind, value = events.get(timeout=timeout)
                except queue.Empty:
                    break  # a process we could not kill holds the pipe
                if kind == "out":
                    yield pb.RunEvent(output=value)
                elif kind == "eof":
                    eof = True
                elif kind == "exit":
                    status = value
        finally:
            kill_stage(pgid, marker)
            os.close(rfd)
            with ex.lock:
                ex.stages.pop(pgid, None)
            try:
                os.unlink(script)
            except OSError:
                pass
        if canceled.is_set():
            yield pb.RunEvent(failure=pb.Failure(kind=pb.Failure.CANCELED, message="stage %s: stopped: %s" % (start.stage, reason[0])))
            return
        code = status if status >= 0 else 128 - status  # killed by a signal: 128 + its number
        yield pb.RunEvent(exit=pb.Exit(code=code))

    def Cleanup(self, request, context):
        with self.lock:
            ex = self.executors.pop(request.executor_id, None)
        if ex is None:
            return pb.CleanupResponse()
        try:
            self.cleanup(ex)
        except OSError as e:
            return pb.CleanupResponse(failure=pb.Failure(kind=pb.Failure.SYSTEM, message="cleanup: %s" % e))
        return pb.CleanupResponse()

    def cleanup(self, ex):
        with ex.lock:
            was_prepared = ex.state == "prepared"
            ex.state = "cleaned"
            stages = list(ex.stages.items())
        for pgid, marker in stages:
            kill_stage(pgid, marker)
        if was_prepared and ex.env is not None:
            shutil.rmtree(ex.env.tmp_dir, ignore_errors=True)

    def Sweep(self, request, context):
        scope = scope_of(request.system_id, request.short_token)
        if scope:
            n = signal_marked(scope + ":", signal.SIGKILL)
            if n:
                log("warn", "killed processes left by an earlier runner manager or plugin process", runner=request.short_token, processes=n)
        return pb.SweepResponse()

    def Shutdown(self, request, context):
        self.shutdown()
        return pb.ShutdownResponse()

    def shutdown(self):
        with self.lock:
            executors = list(self.executors.values())
            self.executors = {}
        for ex in executors:
            self.cleanup(ex)


def watch_parent(plugin):
    parent = os.getppid()
    if parent <= 1:
        return
    while True:
        time.sleep(1)
        if os.getppid() != parent:
            log("warn", "the runner manager is gone; cleaning up and exiting")
            plugin.shutdown()
            os._exit(0)


def controller(plugin):
    """go-plugin's plugin.GRPCController service: the host's Shutdown call
    when it stops the plugin (its messages are empty, so no stubs)."""
    def shutdown(request, context):
        def stop():
            time.sleep(0.05)  # let the answer go out
            plugin.shutdown()
            os._exit(0)
        threading.Thread(target=stop, daemon=True).start()
        return b""
    return grpc.method_handlers_generic_handler("plugin.GRPCController", {
        "Shutdown": grpc.unary_unary_rpc_method_handler(
            shutdown, request_deserializer=lambda b: b, response_serializer=lambda b: b),
    })


def main():
    if len(sys.argv) > 1 and sys.argv[1] in ("version", "--version"):
        print("%s %s (executor protocol %d)" % (NAME, VERSION, PROTOCOL_VERSION))
        return 0
    if os.environ.get(MAGIC_COOKIE_KEY) != MAGIC_COOKIE_VALUE:
        sys.stderr.write("%s is a Berth executor plugin: a runner manager starts it, not a person.\n" % NAME)
        return 1
    offered = [v for v in os.environ.get("PLUGIN_PROTOCOL_VERSIONS", "").split(",") if v]
    if offered and str(PROTOCOL_VERSION) not in offered:
        log("error", "the runner manager offers executor protocol versions %s; this plugin speaks %d" % (",".join(offered), PROTOCOL_VERSION))
    plugin = Plugin()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=64),
                         options=[("grpc.max_receive_message_length", 2**31 - 1), ("grpc.max_send_message_length", 2**31 - 1)])
    pbg.add_ExecutorServicer_to_server(plugin, server)
    server.add_generic_rpc_handlers((controller(plugin),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    threading.Thread(target=watch_parent, args=(plugin,), daemon=True).start()
    # go-plugin's handshake line: core version | app version | network | address | protocol
    sys.stdout.write("%d|%d|tcp|127.0.0.1:%d|grpc\n" % (CORE_PROTOCOL_VERSION, PROTOCOL_VERSION, port))
    sys.stdout.flush()
    log("info", "serving", port=port, pid=os.getpid())
    server.wait_for_termination()
    return 0


if __name__ == "__main__":
    sys.exit(main())
