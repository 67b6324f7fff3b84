"""Simulated hosts on one machine, for multi-host tests: each host is a network namespace with its
own address (a veth pair to a bridge in a namespace of its own: nothing is added to the machine's
own network), and its processes run in their own mount, UTS and pid namespaces, so each host has
a private tmpfs on /dev/shm, its own hostname and its own /proc (a process cannot open another
host's /proc/<pid>/fd/<fd>, as it could not across machines).

    with Hosts(2) as hosts:                     # raises Unsupported where the machine does not allow it
        out = hosts.run({0: [cmd_a, cmd_b], 1: [cmd_c, cmd_d]}, timeout=120)
        # out[host][i] = (exit code, output) of the i-th command on that host

hosts.address(k) is host k's IPv4 address. Needs root, iproute2 (`ip netns`) and util-linux
(`unshare`); Unsupported says which is missing. Everything it creates is removed on exit.
"""
import os
import shlex
import shutil
import subprocess
import tempfile
import time


class Unsupported(Exception):
    """This machine cannot simulate hosts (not root, no `ip`/`unshare`, no namespaces)."""


def _ip(*args, check=True):
    r = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {r.stderr.strip()}")
    return r


class Hosts:
    def __init__(self, count, subnet="10.231.{tag}"):
        if count < 1 or count > 200:
            raise ValueError(f"Hosts: {count} hosts (1 to 200)")
        self.count = count
        # Namespace and interface names carry a tag of this process, so runs side by side do not meet.
        self.tag = f"{os.getpid() % 100000}"
        self.subnet = subnet.format(tag=os.getpid() % 250 + 1)
        self.switch = f"ds{self.tag}sw"
        self.names = [f"ds{self.tag}h{k}" for k in range(count)]
        self._made = []

    def address(self, k):
        return f"{self.subnet}.{k + 1}"

    def __enter__(self):
        if os.geteuid() != 0:
            raise Unsupported("simulated hosts need root (network namespaces and mounts)")
        for tool in ("ip", "unshare", "mount"):
            if shutil.which(tool) is None:
                raise Unsupported(f"simulated hosts need `{tool}` (iproute2, util-linux)")
        try:
            self._make()
        except (RuntimeError, OSError) as e:
            self._remove()
            raise Unsupported(f"cannot build the simulated hosts here: {e}") from e
        return self

    def __exit__(self, *exc):
        self._remove()
        return False

    def _make(self):
        _ip("netns", "add", self.switch)
        self._made.append(self.switch)
        _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", self.switch, "link", "set", "br0", "up")
        for k, ns in enumerate(self.names):
            _ip("netns", "add", ns)
            self._made.append(ns)
            # Both ends are made inside their namespaces: the machine's own namespace never sees them.
            _ip("-n", ns, "link", "add", "eth0", "type", "veth", "peer", "name", f"p{k}", "netns", self.switch)
            _ip("-n", self.switch, "link", "set", f"p{k}", "master", "br0", "up")
            _ip("-n", ns, "addr", "add", f"{self.address(k)}/24", "dev", "eth0")
            _ip("-n", ns, "link", "set", "eth0", "up")
            _ip("-n", ns, "link", "set", "lo", "up")
        # The probe a test would otherwise fail on: can host 0 mount a private /dev/shm and reach the others?
        r = subprocess.run(self._wrap(0, ["true"]), capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise RuntimeError(f"a host's namespaces: {r.stderr.strip()}")

    def _remove(self):
        for ns in reversed(self._made):
            _ip("netns", "del", ns, check=False)
        self._made = []

    def _wrap(self, k, argv):
        # Inside: a private /dev/shm, the host's name, then the command (pid 1 of the host's pid
        # namespace is this shell: when it ends, every process left on the host is killed).
        script = f"mount -t tmpfs -o size=512m,mode=1777 tmpfs /dev/shm && hostname host{k} && exec \"$@\""
        # --kill-child: killing this process (run's kill_host) kills pid 1, and with it the whole host.
        return ["ip", "netns", "exec", self.names[k], "unshare", "--mount", "--uts", "--pid", "--fork", "--mount-proc",
                "--propagation", "private", "--kill-child", "sh", "-c", script, "sh", *argv]

    def run(self, commands, timeout, kill_host=None):
        """commands: {host: [argv, ...]}; runs every command at once, each on its host (the
        commands of one host share it), and returns {host: [(exit code, output), ...]}. A command
        still running after `timeout` seconds is killed (exit code None). kill_host=(k, seconds):
        every process of host k is SIGKILLed that long after the start (a machine lost)."""
        with tempfile.TemporaryDirectory(prefix="ds-hosts-") as tmp:
            procs = []
            for k, argvs in commands.items():
                # One shell per host starts the host's commands side by side and waits for them.
                lines = []
                for i, argv in enumerate(argvs):
                    out = os.path.join(tmp, f"h{k}-{i}")
                    lines.append(f"( {' '.join(shlex.quote(a) for a in argv)} > {out}.out 2>&1; echo $? > {out}.rc ) &")
                lines.append("wait")
                procs.append(subprocess.Popen(self._wrap(k, ["sh", "-c", "\n".join(lines)]), start_new_session=True))
            deadline = time.monotonic() + timeout
            if kill_host is not None:
                time.sleep(kill_host[1])
                procs[list(commands).index(kill_host[0])].kill()
            for p in procs:
                try:
                    p.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, 9)
                    p.wait()
            result = {}
            for k, argvs in commands.items():
                result[k] = []
                for i in range(len(argvs)):
                    out = os.path.join(tmp, f"h{k}-{i}")
                    text = open(out + ".out", errors="replace").read() if os.path.exists(out + ".out") else ""
                    rc = open(out + ".rc").read().strip() if os.path.exists(out + ".rc") else ""
                    result[k].append((int(rc) if rc else None, text))
            return result
