"""A rendezvous port is picked below the kernel's ephemeral range, which every outgoing connection draws its local
port from: a port the kernel picked there was taken, in a full suite, by some connection in the seconds before
AdaptDL's root could listen on it (its rank 0 then connected to that other program: Broken pipe)."""
from __future__ import annotations

import socket

import pytest

from trialkit.launch.launcher import free_port
from trialkit.launch.ports import LOWEST, _ephemeral_low, rendezvous_port


def test_a_rendezvous_port_is_below_the_ephemeral_range_and_free():
    low = _ephemeral_low()
    ports = [rendezvous_port(), rendezvous_port("127.0.0.1"), free_port("127.0.0.1")]
    assert all(LOWEST <= port < low for port in ports), (ports, low)
    for port in ports:  # free: it binds
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", port))
    assert len(set(rendezvous_port() for _ in range(20))) > 10  # drawn, not one fixed port that trials share


def test_an_address_not_of_this_machine_is_an_error():
    with pytest.raises(OSError):
        rendezvous_port("203.0.113.254")  # TEST-NET-3: no machine's own
