#!/usr/bin/env python3
"""A TCP relay that records every byte: what the edge sent to the cloud
(REC.up) and what came back (REC.down), one file each, appended per
connection. Used by serve_edge.sh to assert on what left the device.
Usage: recording_proxy.py UPSTREAM_PORT REC_PREFIX PORT_FILE"""
import socket
import sys
import threading

upstream_port, prefix, port_file = int(sys.argv[1]), sys.argv[2], sys.argv[3]
lock = threading.Lock()


def pump(src, dst, path):
    try:
        while True:
            data = src.recv(65536)
            if not data:
                break
            with lock, open(path, "ab") as f:
                f.write(data)
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass


def serve(client):
    try:
        up = socket.create_connection(("127.0.0.1", upstream_port))
    except OSError:
        client.close()
        return
    threading.Thread(target=pump, args=(client, up, prefix + ".up"), daemon=True).start()
    threading.Thread(target=pump, args=(up, client, prefix + ".down"), daemon=True).start()


listener = socket.socket()
listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
listener.bind(("127.0.0.1", 0))
listener.listen(64)
with open(port_file + ".tmp", "w") as f:
    f.write(str(listener.getsockname()[1]))
import os
os.rename(port_file + ".tmp", port_file)
while True:
    c, _ = listener.accept()
    serve(c)
