"""The referee's line to the candidate's runner: length-prefixed JSON over a Unix socket, file descriptors
passed beside a message (an arena's). JSON only, in both directions: the referee never unpickles anything the
candidate's process sends, and what it reads is size-capped and type-checked before use."""
from __future__ import annotations

import json
import socket
import struct
from typing import Any, Dict, List, Sequence, Tuple

HEADER = struct.Struct("!Q")
MAX_MESSAGE = 64 << 20


class ChannelError(Exception):
    """The other side closed the channel or sent something that is not a message."""


class Channel:
    def __init__(self, sock: socket.socket):
        self.sock = sock

    @classmethod
    def from_fd(cls, fd: int) -> "Channel":
        return cls(socket.socket(fileno=fd))

    def send(self, message: Dict[str, Any], fds: Sequence[int] = ()) -> None:
        payload = json.dumps(message, default=str).encode()
        try:
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
