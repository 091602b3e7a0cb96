"""The server's listening socket makes accepted connections TCP_NODELAY (no Nagle stalls)."""
import asyncio
import socket

import pytest

from serve.net import listen_socket


def test_listen_socket_is_tcp_and_accepted_connections_get_nodelay():
    sock = listen_socket("127.0.0.1", 0)
    assert sock.proto == socket.IPPROTO_TCP
    port = sock.getsockname()[1]
    seen = []

    async def main():
        done = asyncio.Event()

        def accepted(reader, writer):
            seen.append(writer.get_extra_info("socket").getsockopt(
                socket.IPPROTO_TCP, socket.TCP_NODELAY))
            writer.close()
            done.set()
        server = await asyncio.start_server(accepted, sock=sock)
        _, writer = await asyncio.open_connection("127.0.0.1", port)
        await asyncio.wait_for(done.wait(), 30)  # the server side saw the connection
        writer.close()
        server.close()
        await server.wait_closed()

    asyncio.run(main())
    assert seen and seen[0] != 0


def test_listen_socket_busy_port_is_a_clear_error():
    first = listen_socket("127.0.0.1", 0)
    first.listen()
    port = first.getsockname()[1]
    with pytest.raises(OSError, match=f"cannot listen on 127.0.0.1:{port}"):
        listen_socket("127.0.0.1", port)
    first.close()
