"""The pool channel over real loopback sockets: an echo server stands in for the donor's
ggml RPC server (the channel relays bytes unchanged; it reads only where ggml RPC messages
end, to seal a burst once)."""

from __future__ import annotations

import os
import socket
import threading

import pytest

from skulk.pool import channel
from skulk.pool.channel import CHUNK_BYTES, ChannelRefused, DonorGate, DriverLink, Remote

KEY = b"k" * 32
OTHER_KEY = b"x" * 32


@pytest.fixture
def echo_port():
    server = socket.create_server(("127.0.0.1", 0))
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            def pump(c=conn):
                with c:
                    while data := c.recv(65536):
                        c.sendall(data)
            threading.Thread(target=pump, daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    yield server.getsockname()[1]
    stop.set()
    server.close()


@pytest.fixture
def gate(echo_port):
    made: list[DonorGate] = []

    def make(encrypt: bool = True) -> DonorGate:
        g = DonorGate("127.0.0.1", 0, KEY, echo_port, encrypt=encrypt)
        g.start()
        made.append(g)
        return g

    yield make
    for g in made:
        g.close()


def _link(gate: DonorGate, key: bytes, lost: list, encrypt: bool = True) -> DriverLink:
    link = DriverLink(Remote("127.0.0.1", gate.port, "node n1 (rank 1)"), key,
                      lambda remote, why: lost.append((remote.name, why)), encrypt=encrypt)
    link.start()
    return link


def _round_trip(link: DriverLink, payload: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", link.port), timeout=10) as sock:
        # Send while reading: the echo answers as it reads, so a sender that waited for the
        # whole payload to go out first could fill every buffer on the way and stall.
        sender = threading.Thread(target=sock.sendall, args=(payload,), daemon=True)
        sender.start()
        got = bytearray()
        while len(got) < len(payload):
            chunk = sock.recv(1 << 20)
            assert chunk, "the channel closed early"
            got += chunk
        sender.join(timeout=10)
        return bytes(got)


@pytest.mark.parametrize("encrypt", [True, False])
def test_right_key_relays_bytes_both_ways(gate, encrypt):
    g = gate(encrypt)
    lost: list = []
    link = _link(g, KEY, lost, encrypt)
    try:
        link.probe()
        payload = os.urandom(3 * CHUNK_BYTES + 123)  # several frames
        assert _round_trip(link, payload) == payload
        assert lost == [] and g.refused == 0
    finally:
        link.close()


def test_wrong_cluster_key_cannot_join(gate):
    g = gate()
    lost: list = []
    link = _link(g, OTHER_KEY, lost)
    try:
        with pytest.raises(ChannelRefused):
            link.probe()
        # Through the link, llama.cpp would see the connection end, after the loss was named.
        with socket.create_connection(("127.0.0.1", link.port), timeout=10) as sock:
            sock.settimeout(10)
            assert sock.recv(16) == b""
        assert lost and lost[0][0] == "node n1 (rank 1)"
        assert g.refused >= 2
    finally:
        link.close()


@pytest.mark.parametrize("probe", [b"", b"\x00" * 64, b"GET / HTTP/1.0\r\n\r\n" * 8])
def test_a_stray_client_gets_nothing_and_is_disconnected(gate, probe):
    g = gate()
    assert stray_answer(g.port, probe) == b""


def stray_answer(port: int, probe: bytes) -> bytes:
    """What a client without the key reads back; a reset (the gate hung up with our bytes
    unread) counts as nothing."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        try:
            if probe:
                sock.sendall(probe)
                sock.shutdown(socket.SHUT_WR)
            sock.settimeout(10)  # the gate's handshake deadline (5 s) ends a silent client
            return sock.recv(1024)
        except (ConnectionResetError, BrokenPipeError):
            return b""
        except OSError as exc:
            if exc.errno == 107:  # ENOTCONN: reset before our shutdown
                return b""
            raise


def test_a_lost_gate_is_named_before_the_local_socket_closes(gate):
    g = gate()
    events: list[str] = []
    link = DriverLink(Remote("127.0.0.1", g.port, "node n1 (rank 1)"), KEY,
                      lambda remote, why: events.append(f"lost {remote.name}"))
    link.start()
    try:
        with socket.create_connection(("127.0.0.1", link.port), timeout=10) as sock:
            sock.sendall(b"ping")
            assert sock.recv(4) == b"ping"
            g.close()  # the donor goes away mid-conversation
            sock.settimeout(10)
            assert sock.recv(4) == b""
            events.append("local closed")
        assert events == ["lost node n1 (rank 1)", "local closed"]
    finally:
        link.close()


def _silent_gate(stop: threading.Event) -> tuple[socket.socket, list]:
    """A gate that proves the key, then says nothing ever again: a donor whose process or
    node is stopped, or whose traffic is dropped (the kernel keeps the TCP connection up)."""
    from skulk.pool.channel import server_handshake

    server = socket.create_server(("127.0.0.1", 0))
    held: list = []

    def serve():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                return
            server_handshake(conn, KEY)
            held.append(conn)  # open and silent

    threading.Thread(target=serve, daemon=True).start()
    return server, held


def test_a_silent_donor_is_named_lost_at_the_silence_deadline(monkeypatch):
    monkeypatch.setattr(channel, "SILENCE_DEADLINE_S", 0.5)
    stop = threading.Event()
    server, held = _silent_gate(stop)
    events: list[str] = []
    link = DriverLink(Remote("127.0.0.1", server.getsockname()[1], "node n1 (rank 1)"), KEY,
                      lambda remote, why: events.append(f"lost {remote.name}: {why}"))
    link.start()
    try:
        with socket.create_connection(("127.0.0.1", link.port), timeout=30) as sock:
            sock.sendall(b"a request the donor never answers")
            sock.settimeout(30)  # a bound for the test only: the link must end it long before
            assert sock.recv(4) == b""
        assert len(events) == 1 and events[0].startswith("lost node n1 (rank 1): no frame from the peer"), events
    finally:
        stop.set()
        link.close()
        server.close()
        for conn in held:
            conn.close()


@pytest.mark.parametrize("encrypt", [True, False])
def test_a_slow_but_alive_donor_is_not_lost(monkeypatch, encrypt):
    """A donor computing for longer than the silence deadline still heartbeats: its answer
    arrives and nothing is reported lost."""
    monkeypatch.setattr(channel, "SILENCE_DEADLINE_S", 1.5)
    monkeypatch.setattr(channel, "HEARTBEAT_INTERVAL_S", 0.05)
    answered, done = threading.Event(), threading.Event()
    slow = socket.create_server(("127.0.0.1", 0))

    def serve():
        conn, _ = slow.accept()
        with conn:
            request = conn.recv(64)
            answered.wait(4.0)  # "computing" for well over the deadline
            conn.sendall(request)
            done.wait(30)  # a donor keeps its connection: its end would be a loss

    threading.Thread(target=serve, daemon=True).start()
    g = DonorGate("127.0.0.1", 0, KEY, slow.getsockname()[1], encrypt=encrypt)
    g.start()
    lost: list = []
    link = _link(g, KEY, lost, encrypt)
    try:
        with socket.create_connection(("127.0.0.1", link.port), timeout=30) as sock:
            sock.sendall(b"ping")
            sock.settimeout(30)
            assert sock.recv(4) == b"ping"
            assert lost == []
    finally:
        answered.set()
        done.set()
        link.close()
        g.close()
        slow.close()


def _request(command: int, payload: bytes) -> bytes:
    return bytes([command]) + len(payload).to_bytes(8, "little") + payload


@pytest.mark.parametrize("encrypt", [True, False])
def test_a_burst_written_in_pieces_crosses_as_one_frame(gate, encrypt, monkeypatch):
    """llama.cpp writes each RPC command as three sends (command, size, payload); the link
    seals the burst once: the rest of a message and the command after a data-only one are
    waited for (the wait is made long here, so the count does not depend on scheduling),
    and the bytes arrive unchanged."""
    import time

    monkeypatch.setattr(channel, "BURST_WAIT_S", 1.0)
    frames: list[int] = []
    send = channel._FrameWriter.send

    def counted(self, payload):
        frames.append(len(payload))
        return send(self, payload)

    monkeypatch.setattr(channel._FrameWriter, "send", counted)
    g = gate(encrypt)
    lost: list = []
    link = _link(g, KEY, lost, encrypt)
    burst = [_request(6, b"a" * 4096), _request(16, b"g" * 300), _request(8, b"r" * 24)]  # set, recompute, get
    try:
        with socket.create_connection(("127.0.0.1", link.port), timeout=10) as sock:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            frames.clear()  # the echo's own frames back come through the gate's writer: count from here
            for message in burst:
                for piece in (message[:1], message[1:9], message[9:]):
                    sock.sendall(piece)
                    time.sleep(0.02)
            expected = b"".join(burst)
            got = bytearray()
            while len(got) < len(expected):
                chunk = sock.recv(1 << 20)
                assert chunk, "the channel closed early"
                got += chunk
        assert bytes(got) == expected
        towards_donor = [n for n in frames if n == len(expected)]
        assert towards_donor, f"the burst was not sealed as one frame: {frames}"
        assert lost == []
    finally:
        link.close()


@pytest.mark.parametrize("encrypt", [True, False])
def test_closing_a_link_mid_burst_reports_no_loss(gate, encrypt, monkeypatch):
    """A link closed (its engine torn down) while it waits for more of a burst after a
    data-only command: the bytes it holds cannot be delivered any more, and that is the
    teardown, not the donor's loss (a loss is fatal to the driver)."""
    import time

    monkeypatch.setattr(channel, "BURST_WAIT_S", 2.0)
    g = gate(encrypt)
    lost: list = []
    link = _link(g, KEY, lost, encrypt)
    sock = socket.create_connection(("127.0.0.1", link.port), timeout=10)
    try:
        sock.sendall(_request(4, b"f" * 16))  # FREE_BUFFER: data only, so the link waits for more
        time.sleep(0.2)
    finally:
        link.close()
        sock.close()
    time.sleep(0.3)  # let the relay threads see the sockets end
    assert lost == []
