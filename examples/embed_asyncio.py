"""A worker inside an existing asyncio service: await worker.serve(), stop with the service.

Run: python examples/embed_asyncio.py [REDIS_URL]
"""

import asyncio
import sys

import streamwork as sw
from streamwork.testing import RedisServer


class Thumbnails(sw.StreamWorker):
    stream = "images"
    group = "thumbnailer"
    done = 0
    all_done = asyncio.Event()

    async def handle(self, msg: sw.Message) -> None:
        await asyncio.sleep(0.01)  # resize...
        type(self).done += 1
        if type(self).done == 100:
            self.all_done.set()


async def service(url: str) -> None:
    worker = Thumbnails.from_url(url)
    serving = asyncio.create_task(worker.serve())  # runs beside the rest of the service
    async with sw.AsyncProducer.from_url(url) as producer:
        await producer.send_many("images", [{"path": f"/img/{i}.png"} for i in range(100)])
        await Thumbnails.all_done.wait()
    worker.stop()  # e.g. from the service's shutdown hook
    await serving  # returns once in-flight jobs finished
    print(f"made {Thumbnails.done} thumbnails; {worker!r}")


if __name__ == "__main__":
    if len(sys.argv) > 1:
        asyncio.run(service(sys.argv[1]))
    else:
        with RedisServer() as server:
            asyncio.run(service(server.url))
