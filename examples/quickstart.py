"""Producer and worker in one script: python examples/quickstart.py [REDIS_URL]."""

import sys

import streamwork as sw
from streamwork.testing import RedisServer


class Emails(sw.StreamWorker):
    stream = "emails"
    group = "mailer"

    async def handle(self, msg: sw.Message) -> None:
        print(f"sending {msg.payload['template']} to {msg.payload['to']} (attempt {msg.attempt})")
        if msg.attempt == 1 and msg.payload["to"].endswith("@flaky.example"):
            raise sw.Retry(delay=0.1)  # e.g. the mail API said 503: try again shortly
        if msg.payload["to"] == "nobody":
            raise sw.DeadLetter("no such recipient")  # no retry: straight to dead letters
        if msg.payload.get("last"):
            self.stop()


def main(url: str) -> None:
    producer = sw.Producer.from_url(url)
    producer.send("emails", {"to": "ada@example.com", "template": "welcome"}, key="welcome-ada")
    producer.send("emails", {"to": "bob@flaky.example", "template": "welcome"})
    producer.send("emails", {"to": "nobody", "template": "welcome"})
    producer.send("emails", {"to": "ops@example.com", "template": "report", "last": True},
                  delay=0.5)
    Emails.from_url(url, retry_delay=0.1, retry_max_delay=1.0).run()  # until self.stop()


if __name__ == "__main__":
    if len(sys.argv) > 1:
        main(sys.argv[1])
    else:
        with RedisServer() as server:  # a private redis-server on a free loopback port
            main(server.url)
