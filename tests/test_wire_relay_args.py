#!/usr/bin/env python3
"""bench/multiworker/wire_relay (the two-host benchmarks' simulated wire) refuses a bad delay or CPU
with a message naming the argument, before it opens any device, and names the namespace it cannot
open; as root, between two namespaces the test makes, a CPU that is not this machine's fails the
pin with the system's reason."""

import os
import shutil
import subprocess
import sys
import unittest

RELAY = sys.argv.pop(1) if len(sys.argv) > 1 else "wire_relay"


def run(*args):
    r = subprocess.run([RELAY, *args], capture_output=True, text=True, timeout=30)
    return r.returncode, r.stderr


class WireRelayArguments(unittest.TestCase):
    def test_usage(self):
        rc, err = run("a", "b")
        self.assertEqual(rc, 2)
        self.assertIn("usage: wire_relay NETNS_A NETNS_B DELAY_US [CPU_A CPU_B]", err)

    def test_bad_numbers(self):
        cases = [
            (("a", "b", "-5"), "DELAY_US must be a whole number from 0 to 10000000, not '-5'"),
            (("a", "b", "200us"), "DELAY_US must be a whole number from 0 to 10000000, not '200us'"),
            (("a", "b", "99999999999999999999"), "DELAY_US must be a whole number from 0 to 10000000"),
            (("a", "b", "200", "", "1"), "CPU_A must be a whole number from 0 to 1023, not ''"),
            (("a", "b", "200", "0", "two"), "CPU_B must be a whole number from 0 to 1023, not 'two'"),
            (("a", "b", "200", "0", "4096"), "CPU_B must be a whole number from 0 to 1023, not '4096'"),
        ]
        for args, message in cases:
            with self.subTest(args=args):
                rc, err = run(*args)
                self.assertEqual(rc, 2)
                self.assertIn(message, err)

    def test_missing_namespace(self):
        rc, err = run("ds-no-such-netns", "b", "200")
        self.assertEqual(rc, 1)
        self.assertIn("wire_relay: open namespace ds-no-such-netns: No such file or directory", err)

    def test_cpu_not_on_this_machine(self):
        if os.geteuid() != 0 or shutil.which("ip") is None:
            self.skipTest("needs root and iproute2 to make two network namespaces")
        cpu = 1023
        if cpu < os.cpu_count():
            self.skipTest(f"this machine has CPU {cpu}")
        names = [f"dswr{os.getpid() % 100000}{side}" for side in "ab"]
        try:
            for ns in names:
                subprocess.run(["ip", "netns", "add", ns], check=True, capture_output=True)
            rc, err = run(*names, "200", "0", str(cpu))
        finally:
            for ns in names:
                subprocess.run(["ip", "netns", "del", ns], capture_output=True)
        self.assertEqual(rc, 1)
        self.assertIn(f"wire_relay: pin to CPU {cpu}: Invalid argument", err)


if __name__ == "__main__":
    unittest.main()
