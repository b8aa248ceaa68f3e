"""Constrained and free clients at once through `jacobi-rt serve` (issue 23's last goal).

    python -m jacobi_rt.tools.structured_load build/smollm2-135m [--draft DRAFT] [--clients 16] [--rounds 2]
        [--strategy auto] [--max-tokens 256] [--out FILE.json]

Half the clients ask an extraction item's chat prompt with its JSON schema as `response_format`
(tools/data/extraction.jsonl); each of the other half asks the same prompt unconstrained (its
neighbour: the same prompt, at most as many tokens as the constrained answer has, so the two rows live
through the same passes). Greedy (temperature 0), every
request streamed. First each constrained request runs alone (its solo answer); then every round sends
all the clients' requests at once. Every constrained answer must equal its solo answer, and parse and
validate (jsonschema) where it finished ("length": cut short by --max-tokens, answered as such). Per pair: each side's stream tokens/s (tokens after the first over the time after the
first piece, median over rounds), tokens per pass, and the constrained side's mask share (the server's
`jacobi.constraint.mask_seconds` over the stream's decode time): a constrained client slower than its
neighbour by more than that share pays for something besides its masks.

Without --url it starts `jacobi-rt serve ARTIFACT --max-batch CLIENTS` itself (load_bench.local_server).
"""

from __future__ import annotations

import http.client
import json
import statistics
import threading
import time

import click

from .load_bench import _host_port, local_server


def stream(url: str, body: dict) -> dict:
    """One streamed chat request: its text, tokens, decode seconds (first piece to last) and jacobi stats."""
    host, port = _host_port(url)
    conn = http.client.HTTPConnection(host, port, timeout=900)
    try:
        body = {**body, "stream": True, "stream_options": {"include_usage": True}}
        sent = time.perf_counter()
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            raise click.ClickException(f"the server answered {response.status}: {response.read()[:300]!r}")
        pieces, first, last, tokens, stats, finish = [], None, None, 0, {}, None
        for raw in response:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[len("data: "):])
            if "error" in event:
                raise click.ClickException(f"the stream failed: {event['error']}")
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
            for choice in event.get("choices") or ():
                finish = choice.get("finish_reason") or finish
                piece = choice.get("delta", {}).get("content") or ""
                if piece:
                    pieces.append(piece)
                    last = time.perf_counter()
                    first = first or last
            stats = event.get("jacobi", stats)
        decode = (last - first) if first and last and last > first else 0.0
        return {"text": "".join(pieces), "finish": finish, "tokens": tokens, "first_token": (first or sent) - sent, "decode_seconds": decode,
                "tokens_per_second": max(tokens - 1, 0) / decode if decode else 0.0, "jacobi": stats}
    finally:
        conn.close()


def burst(url: str, bodies: list[dict]) -> list[dict]:
    """Every body sent at the same moment, one thread each; the answers in order."""
    answers: list[dict | BaseException] = [None] * len(bodies)
    start = threading.Barrier(len(bodies))

    def client(i: int) -> None:
        start.wait()
        try:
            answers[i] = stream(url, bodies[i])
        except BaseException as exc:  # reported below, with the others' answers
            answers[i] = exc

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for answer in answers:
        if isinstance(answer, BaseException):
            raise answer
    return answers


@click.command()
@click.argument("artifact", type=click.Path(exists=True, file_okay=False))
@click.option("--draft", type=click.Path(exists=True, file_okay=False), default=None, help="The started server's --draft.")
@click.option("--url", default=None, help="A server already running at this URL (its --max-batch should hold the clients).")
@click.option("--clients", type=click.IntRange(2, 64), default=16, show_default=True, help="Concurrent clients; half constrained.")
@click.option("--rounds", type=click.IntRange(1), default=2, show_default=True, help="Bursts of every client at once.")
@click.option("--strategy", default="auto", show_default=True)
@click.option("--max-tokens", type=click.IntRange(1), default=256, show_default=True)
@click.option("--threads", type=click.IntRange(1), default=2, show_default=True, help="The started server's --threads.")
@click.option("--out", type=click.Path(dir_okay=False), default=None, help="Write every answer and figure as JSON here.")
def main(artifact, draft, url, clients, rounds, strategy, max_tokens, threads, out):
    import jsonschema  # noqa: F401  (needed: a missing package fails here, before the servers start)

    from .extraction import extraction_set, follows_schema

    items = extraction_set()
    pairs = clients // 2
    if pairs > len(items):
        raise click.BadParameter(f"the extraction set has {len(items)} items: at most {2 * len(items)} clients")
    items = items[:pairs]
    base = {"max_tokens": max_tokens, "temperature": 0, "jacobi": {"strategy": strategy}}
    constrained = [{**base, "messages": [{"role": "user", "content": item.prompt}],
                    "response_format": {"type": "json_schema", "json_schema": {"name": item.id, "schema": item.schema}}}
                   for item in items]
    extra = ["--draft", draft] if draft else []
    server = local_server(artifact, 64, threads, None, max_batch=clients, extra=extra) if url is None else _given(url)
    with server as url:
        solo = [stream(url, body) for body in constrained]
        click.echo(f"solo: {len(solo)} constrained answers", err=True)
        # each neighbour asks as many tokens as its constrained answer has, so both rows share the same passes
        free = [{**base, "messages": [{"role": "user", "content": item.prompt}], "max_tokens": max(answer["tokens"], 2)}
                for item, answer in zip(items, solo)]
        runs = []
        for round_ in range(rounds):
            answers = burst(url, [*constrained, *free])
            runs.append(answers)
            click.echo(f"round {round_ + 1}: " + ", ".join(f"{a['tokens_per_second']:.1f}" for a in answers), err=True)
    rows = []
    for i, item in enumerate(items):
        mine = [run[i] for run in runs]
        theirs = [run[pairs + i] for run in runs]
        valid = "length" if any(a["finish"] != "stop" for a in mine) else all(follows_schema(a["text"], item.schema) for a in mine)
        same = all(a["text"] == solo[i]["text"] for a in mine)
        mask = [a["jacobi"].get("constraint", {}).get("mask_seconds", 0.0) / a["decode_seconds"] for a in mine if a["decode_seconds"]]
        rows.append(dict(item=item.id, valid=valid, same_as_solo=same, tokens=mine[0]["tokens"],
                         tokens_per_second=statistics.median(a["tokens_per_second"] for a in mine),
                         tokens_per_pass=statistics.median(a["jacobi"].get("tokens_per_pass", 0.0) for a in mine),
                         mask_share=statistics.median(mask) if mask else 0.0,
                         neighbour_tokens=theirs[0]["tokens"],
                         neighbour_tokens_per_second=statistics.median(a["tokens_per_second"] for a in theirs),
                         neighbour_tokens_per_pass=statistics.median(a["jacobi"].get("tokens_per_pass", 0.0) for a in theirs)))
    click.echo(table(rows))
    if out:
        with open(out, "w") as f:
            json.dump({"pairs": rows, "solo": solo, "runs": runs}, f)
    if not all(r["valid"] and r["same_as_solo"] for r in rows):  # "length": cut short, answered as such (never as complete)
        raise click.ClickException("a constrained answer did not validate or differed from its solo answer (see above)")


def table(rows: list[dict]) -> str:
    lines = ["| item | valid | = solo | tokens | tok/s | tok/pass | mask share | neighbour tokens | neighbour tok/s | "
             "neighbour tok/pass | constrained / neighbour |", "|" + "---|" * 11]
    for r in rows:
        ratio = r["tokens_per_second"] / r["neighbour_tokens_per_second"] if r["neighbour_tokens_per_second"] else float("nan")
        valid = r["valid"] if isinstance(r["valid"], str) else "yes" if r["valid"] else "NO"
        lines.append(f"| {r['item']} | {valid} | {'yes' if r['same_as_solo'] else 'NO'} | {r['tokens']} | "
                     f"{r['tokens_per_second']:.1f} | {r['tokens_per_pass']:.2f} | {100 * r['mask_share']:.1f}% | "
                     f"{r['neighbour_tokens']} | {r['neighbour_tokens_per_second']:.1f} | {r['neighbour_tokens_per_pass']:.2f} | "
                     f"{ratio:.2f}x |")
    return "\n".join(lines)


class _given:
    """A server already running, as a context like local_server's."""

    def __init__(self, url: str):
        self.url = url

    def __enter__(self) -> str:
        return self.url

    def __exit__(self, *exc) -> None:
        pass


if __name__ == "__main__":
    main()
