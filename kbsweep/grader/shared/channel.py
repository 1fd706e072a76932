"""The referee's line to the candidate's runner: length-prefixed JSON over a Unix socket, file descriptors
passed beside a message (an arena's). JSON only, in both directions: the referee never unpickles anything the
candidate's process sends, and what it reads is size-capped and type-checked before use. A single-process grade
gets a socket pair; a multi-rank grade's runner ranks dial their referee ranks (:func:`connect_rank`)."""

from __future__ import annotations

import hmac
import json
import socket
import struct
import threading
import time
from pathlib import Path
from typing import Any, Dict, List, Sequence, Tuple

HEADER = struct.Struct("!Q")
MAX_MESSAGE = 64 << 20


class ChannelError(Exception):
    """The other side closed the channel or sent something that is not a message."""


class Channel:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        self.lock = threading.Lock()  # the runner's audit hook sends from whatever thread raised an event

    @classmethod
    def from_fd(cls, fd: int) -> "Channel":
        return cls(socket.socket(fileno=fd))

    def send(self, message: Dict[str, Any], fds: Sequence[int] = ()) -> None:
        payload = json.dumps(message, default=str).encode()
        try:
            with self.lock:
                socket.send_fds(self.sock, [HEADER.pack(len(payload))], list(fds))
                self.sock.sendall(payload)
        except OSError as exc:
            raise ChannelError(f"channel closed ({exc})") from None

    def receive(self) -> Tuple[Dict[str, Any], List[int]]:
        try:
            header, fds, _, _ = socket.recv_fds(self.sock, HEADER.size, 4)
            if len(header) < HEADER.size:
                header += self.exactly(HEADER.size - len(header))
            (size,) = HEADER.unpack(header)
            if size > MAX_MESSAGE:
                raise ChannelError(f"message of {size} bytes (limit {MAX_MESSAGE})")
            message = json.loads(self.exactly(size))
        except OSError as exc:
            raise ChannelError(f"channel closed ({exc})") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise ChannelError(f"not a message ({exc})") from None
        if not isinstance(message, dict):
            raise ChannelError("not a message (not a JSON object)")
        return message, fds

    def exactly(self, size: int) -> bytes:
        chunks, left = [], size
        while left:
            chunk = self.sock.recv(min(left, 1 << 20))
            if not chunk:
                raise ChannelError("channel closed")
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)


# -- ranks under torchrun: its agent closes inherited descriptors, so each runner rank dials its referee rank --------
def rank_socket(folder: Path, rank: int) -> Path:
    return folder / f"rank{rank}.sock"


def listen(folder: Path, rank: int) -> socket.socket:
    """The referee rank's listening socket, in the grade's rendezvous folder."""
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(rank_socket(folder, rank)))
    listener.listen(4)
    return listener


def accept_rank(listener: socket.socket, token: str, rank: int, timeout_s: float) -> Channel:
    """The first connection that presents the grade's token and this rank (a stray process that dials the socket
    without them is dropped); ChannelError when none comes within ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    while True:
        listener.settimeout(max(deadline - time.monotonic(), 0.01))
        try:
            sock, _ = listener.accept()
        except socket.timeout:
            raise ChannelError(f"no runner rank {rank} connected within {timeout_s:.0f} s") from None
        sock.settimeout(10)  # the hello comes at once
        channel = Channel(sock)
        try:
            hello, _ = channel.receive()
        except ChannelError:
            sock.close()
            continue
        if hmac.compare_digest(str(hello.get("token")), token) and hello.get("rank") == rank:
            sock.settimeout(None)
            return channel
        sock.close()


def connect_rank(folder: Path, rank: int, token: str, timeout_s: float = 600.0) -> Channel:
    """A runner rank's line to its referee rank (which may not be listening yet)."""
    deadline = time.monotonic() + timeout_s
    while True:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(str(rank_socket(folder, rank)))
            break
        except (FileNotFoundError, ConnectionRefusedError):
            sock.close()
            if time.monotonic() > deadline:
                raise ChannelError(f"referee rank {rank} never listened") from None
            time.sleep(0.1)
    channel = Channel(sock)
    channel.send({"token": token, "rank": rank})
    return channel
