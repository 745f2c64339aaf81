"""Issue 47's done-when run, by hand (not collected): the image corpus (every family), the issue's cases and the
hostile video corpus, one request each through a real server (tiny K2.5 on the CPU, every limit at its default),
with a small valid request every 0.1 s meanwhile. Prints the outcomes, any answer over 5 s, any 5xx, the small
requests' p99 and refusals, and the decode workers' RSS at rest before and after.

    python -m tests.acceptance.hostile_run      # figures: docs/reliability.md, "Corpus, fuzzing, soak"
"""

from __future__ import annotations

import collections
import threading
import time

import grpc

from mmproc.v1 import encoder_pb2 as pb
from mmproc.v1 import encoder_pb2_grpc as pb_grpc
from service.pipeline.decode.worker import resident_bytes
from tests.support.corpus import build_corpus
from tests.support.cost_samples import bmp_rle_slow, jpeg_dc_scan_bomb, png_inflated_metadata
from tests.support.media_samples import make_image_bytes, make_png_bomb
from tests.support.server import serving, test_settings
from tests.support.video_corpus import hostile, valid_controls


def main() -> None:
    images = [(case.name, [case.data]) for case in build_corpus()]
    images += [
        ("issue/jpeg-100-dc-scans-444", [jpeg_dc_scan_bomb(1024, 1024, 100)]),
        ("issue/png-300-iccp", [png_inflated_metadata(300)]),
        ("issue/bmp-rle-40mp-within-the-ratio", [bmp_rle_slow(6400, 6250)]),
        ("issue/32-png-1bit-40mp", [make_png_bomb(6300 + i, 6300) for i in range(32)]),
    ]
    videos = [(case.name, case.data) for case in valid_controls() + hostile() if case.limits == type(case.limits)()]
    with serving(test_settings(model="tiny-k2.5")) as server:
        pool = server.service.pipeline.decode_pool
        time.sleep(1)
        idle = {pid: resident_bytes(pid) >> 20 for pid in pool.worker_pids()}
        channel = grpc.insecure_channel(server.grpc_target, options=[("grpc.max_receive_message_length", 256 << 20)])
        stub = pb_grpc.EncoderStub(channel)
        small = make_image_bytes(64, 48, fmt="JPEG")
        stop, latencies, refused = threading.Event(), [], []

        def probe() -> None:
            while not stop.is_set():
                asked = time.monotonic()
                try:
                    request = pb.EncodeImagesRequest(images=[small], transport=pb.TRANSPORT_SERIALIZED)
                    stub.EncodeImages(request, timeout=10)
                    latencies.append(time.monotonic() - asked)
                except grpc.RpcError as exc:
                    refused.append(exc.code().name)
                time.sleep(max(0.0, 0.1 - (time.monotonic() - asked)))

        prober = threading.Thread(target=probe)
        prober.start()
        codes, slow, server_errors = collections.Counter(), [], []

        def send(name: str, call, request) -> None:
            asked = time.monotonic()
            try:
                call(request, timeout=30)
                code = "OK"
            except grpc.RpcError as exc:
                code = exc.code().name
            took = time.monotonic() - asked
            codes[code] += 1
            if took > 5:
                slow.append((name, code, round(took, 1)))
            if code in ("INTERNAL", "UNKNOWN", "UNAVAILABLE", "DATA_LOSS"):
                server_errors.append((name, code))

        for name, data in images:
            send(name, stub.EncodeImages, pb.EncodeImagesRequest(images=data, transport=pb.TRANSPORT_SERIALIZED))
        for name, data in videos:
            request = pb.EncodeVideosRequest(videos=[pb.Video(data=data)], transport=pb.TRANSPORT_SERIALIZED)
            send(name, stub.EncodeVideos, request)
        stop.set()
        prober.join()
        time.sleep(1)
        latencies.sort()
        p99 = latencies[int(0.99 * (len(latencies) - 1))]
        print("requests", sum(codes.values()), dict(codes))
        print("over 5 s:", slow)
        print("5xx:", server_errors)
        print(
            f"small requests: {len(latencies)} served, {len(refused)} refused; p99 {p99:.3f} s, max {latencies[-1]:.3f} s"
        )
        after = {pid: resident_bytes(pid) >> 20 for pid in pool.worker_pids()}
        print("decode workers' RSS (MB) at rest: idle", idle, "after", after, "retired", pool.retired)


if __name__ == "__main__":
    main()
