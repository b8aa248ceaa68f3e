"""Constrained and free clients at once through `jacobi-rt serve` (issue 23's last goal).

    python -m benchmarks.structured_load build/smollm2-135m [--draft DRAFT] [--clients 16] [--rounds 2]
        [--pairs schema|same-text] [--strategy auto] [--max-tokens 256] [--out FILE.json]

Half the clients are constrained, each beside an unconstrained neighbour asking the same prompt, greedy
(temperature 0), every request streamed. Two ways to pair them (--pairs):

- `schema`: an extraction item's chat prompt (benchmarks/data/extraction.jsonl) with its JSON schema as
  `response_format`, beside the same prompt free, at most as many tokens as the constrained answer has (so
  the two rows live through the same passes). The two write different text, and tokens/s depends on what
  the text lets lookahead guess, so each row is also measured against its own solo run (its load penalty:
  tokens/s under load over tokens/s alone).
- `same-text`: the item's prompt asking for its fields in a form (extraction.form_prompt); the free answer
  alone, and a schema read off it (extraction.answer_schema: its keys, its values' types, its whitespace).
  An item pairs when its constrained answer alone is the free answer token for token (the same text and
  token count); the first items that do are sent. Both rows then commit the same tokens, so tokens/s
  compares being constrained (masks, the grammar's cuts and forced runs) in the same passes, nothing else.

Each constrained and free request first runs alone (its solo answer); then every round sends all the
clients' requests at once, pair by pair, the constrained side first in odd rounds and the free side first
in even ones (a row admitted earlier streams while later rows still prefill). Every constrained answer
must equal its solo answer, and parse and validate (jsonschema) where it finished ("length": cut short by
--max-tokens, answered as such); a same-text pair's two answers must stay equal. Per pair, medians over
the rounds: each side's stream tokens/s (tokens after the first over the time after the first piece),
tokens per pass, load penalty and request time (sent to last piece), and the constrained side's mask
share (the server's `jacobi.constraint.mask_seconds` over the stream's decode time): a constrained client
slower than its neighbour by more than that share pays for something besides its masks.

Without --url it starts `jacobi-rt serve ARTIFACT --max-batch CLIENTS` itself (load_bench.local_server).
"""

from __future__ import annotations

import contextlib
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
            event = json.loads(line[len("data: ") :])
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
        return {
            "text": "".join(pieces),
            "finish": finish,
            "tokens": tokens,
            "first_token": (first or sent) - sent,
            "decode_seconds": decode,
            "tokens_per_second": max(tokens - 1, 0) / decode if decode else 0.0,
            "jacobi": stats,
        }
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
@click.option(
    "--draft", type=click.Path(exists=True, file_okay=False), default=None, help="The started server's --draft."
)
@click.option(
    "--url", default=None, help="A server already running at this URL (its --max-batch should hold the clients)."
)
@click.option(
    "--clients", type=click.IntRange(2, 64), default=16, show_default=True, help="Concurrent clients; half constrained."
)
@click.option("--rounds", type=click.IntRange(1), default=2, show_default=True, help="Bursts of every client at once.")
@click.option(
    "--pairs",
    "pairing",
    type=click.Choice(["schema", "same-text"]),
    default="schema",
    show_default=True,
    help="schema: each item's schema beside the same prompt free; same-text: a schema read off the free "
    "answer, pairs kept where both answers are the same tokens.",
)
@click.option("--strategy", default="auto", show_default=True)
@click.option(
    "--prefix-cache/--no-prefix-cache",
    default=True,
    show_default=True,
    help="The started server's prefix cache (off: neither side of a pair starts from the other's cached prompt).",
)
@click.option("--max-tokens", type=click.IntRange(1), default=256, show_default=True)
@click.option("--threads", type=click.IntRange(1), default=2, show_default=True, help="The started server's --threads.")
@click.option(
    "--out", type=click.Path(dir_okay=False), default=None, help="Write every answer and figure as JSON here."
)
def main(artifact, draft, url, clients, rounds, pairing, strategy, prefix_cache, max_tokens, threads, out):
    import jsonschema  # noqa: F401  (needed: a missing package fails here, before the servers start)

    from .extraction import extraction_set

    items = extraction_set()
    pairs = clients // 2
    if pairing == "schema" and pairs > len(items):
        raise click.BadParameter(f"the extraction set has {len(items)} items: at most {2 * len(items)} clients")
    base = {"max_tokens": max_tokens, "temperature": 0, "jacobi": {"strategy": strategy}}
    extra = (["--draft", draft] if draft else []) + ([] if prefix_cache else ["--no-prefix-cache"])
    server = (
        local_server(artifact, 64, threads, None, max_batch=clients, extra=extra)
        if url is None
        else contextlib.nullcontext(url)
    )
    with server as url:
        paired = (schema_pairs if pairing == "schema" else same_text_pairs)(url, items, base, pairs)
        click.echo(f"solo: {len(paired)} pairs, each side alone", err=True)
        runs = []  # per round: each pair's (constrained, free) answers
        for round_ in range(rounds):
            # pair by pair, the constrained side first in odd rounds and the free side first in even ones: a row
            # admitted earlier starts streaming while later rows still prefill, so each order gets half the rounds
            sides = [(0, 1) if round_ % 2 == 0 else (1, 0)] * len(paired)
            bodies = [(p["constrained"], p["free"])[side] for p, order in zip(paired, sides) for side in order]
            answers = iter(burst(url, bodies))
            run = [dict(zip(order, (next(answers), next(answers)))) for order in sides]
            runs.append([(r[0], r[1]) for r in run])
            click.echo(
                f"round {round_ + 1}: "
                + ", ".join(f"{c['tokens_per_second']:.1f}/{f['tokens_per_second']:.1f}" for c, f in runs[-1]),
                err=True,
            )
    rows = [figures(p, [run[i][0] for run in runs], [run[i][1] for run in runs], pairing) for i, p in enumerate(paired)]
    click.echo(table(rows))
    if out:
        with open(out, "w") as f:
            json.dump({"pairing": pairing, "pairs": rows, "paired": paired, "runs": runs}, f)
    if not all(
        r["valid"] and r["same_as_solo"] and r["same_text"] is not False for r in rows
    ):  # "length": answered as such
        raise click.ClickException(
            "a constrained answer did not validate, differed from its solo answer, or (same-text) "
            "from its neighbour's (see above)"
        )


def constrained_body(base: dict, prompt: str, name: str, schema: dict) -> dict:
    return {
        **base,
        "messages": [{"role": "user", "content": prompt}],
        "response_format": {"type": "json_schema", "json_schema": {"name": name, "schema": schema}},
    }


def schema_pairs(url: str, items: list, base: dict, pairs: int) -> list[dict]:
    """Each item's prompt and schema beside the same prompt free, asking as many tokens as the constrained answer
    has (so both rows share the same passes); each side alone first."""
    paired = []
    for item in items[:pairs]:
        constrained = constrained_body(base, item.prompt, item.id, item.schema)
        solo = stream(url, constrained)
        free = {**base, "messages": [{"role": "user", "content": item.prompt}], "max_tokens": max(solo["tokens"], 2)}
        paired.append(
            dict(
                item=item.id,
                schema=item.schema,
                constrained=constrained,
                free=free,
                solo=solo,
                free_solo=stream(url, free),
            )
        )
    return paired


def same_text_pairs(url: str, items: list, base: dict, pairs: int) -> list[dict]:
    """The first `pairs` items whose free answer to the form prompt is a JSON object that, as the schema read off it
    constrains the same prompt, comes out token for token again; the items that do not pair are named on stderr."""
    from .extraction import answer_schema, form_prompt

    paired = []
    for item in items:
        if len(paired) == pairs:
            break
        free = {**base, "messages": [{"role": "user", "content": form_prompt(item)}]}
        free_solo = stream(url, free)
        schema = answer_schema(free_solo["text"]) if free_solo["finish"] == "stop" else None
        if schema is None:
            click.echo(
                f"{item.id}: not paired, the free answer is not one finished JSON object without repeated keys",
                err=True,
            )
            continue
        constrained = constrained_body(base, form_prompt(item), item.id, schema)
        solo = stream(url, constrained)
        if (solo["text"], solo["tokens"]) != (free_solo["text"], free_solo["tokens"]):
            click.echo(f"{item.id}: not paired, the constrained answer differs from the free one", err=True)
            continue
        paired.append(
            dict(item=item.id, schema=schema, constrained=constrained, free=free, solo=solo, free_solo=free_solo)
        )
    if len(paired) < pairs:
        raise click.ClickException(
            f"only {len(paired)} of the extraction set's items give same-text pairs; "
            f"ask for at most {2 * len(paired)} clients"
        )
    return paired


def figures(pair: dict, mine: list[dict], theirs: list[dict], pairing: str) -> dict:
    """One pair's figures: the constrained side's answers in each round (`mine`) and its neighbour's (`theirs`)."""
    from .extraction import follows_schema

    valid = (
        "length"
        if any(a["finish"] != "stop" for a in mine)
        else all(follows_schema(a["text"], pair["schema"]) for a in mine)
    )
    mask = [
        a["jacobi"].get("constraint", {}).get("mask_seconds", 0.0) / a["decode_seconds"]
        for a in mine
        if a["decode_seconds"]
    ]

    def seconds(answers: list[dict]) -> float:  # sent to last piece
        return statistics.median(a["first_token"] + a["decode_seconds"] for a in answers)

    return dict(
        item=pair["item"],
        valid=valid,
        same_as_solo=all(a["text"] == pair["solo"]["text"] for a in mine),
        same_text=all(a["text"] == b["text"] for a, b in zip(mine, theirs)) if pairing == "same-text" else None,
        tokens=mine[0]["tokens"],
        tokens_per_second=statistics.median(a["tokens_per_second"] for a in mine),
        tokens_per_pass=statistics.median(a["jacobi"].get("tokens_per_pass", 0.0) for a in mine),
        mask_share=statistics.median(mask) if mask else 0.0,
        seconds=seconds(mine),
        neighbour_seconds=seconds(theirs),
        solo_tokens_per_second=pair["solo"]["tokens_per_second"],
        neighbour_tokens=theirs[0]["tokens"],
        neighbour_tokens_per_second=statistics.median(a["tokens_per_second"] for a in theirs),
        neighbour_tokens_per_pass=statistics.median(a["jacobi"].get("tokens_per_pass", 0.0) for a in theirs),
        neighbour_solo_tokens_per_second=pair["free_solo"]["tokens_per_second"],
    )


def table(rows: list[dict]) -> str:
    """Per pair: each side's tokens, tokens/s, tokens per pass and load penalty (tokens/s under load over alone),
    the mask's share of the constrained stream, constrained / neighbour tokens/s, and neighbour / constrained
    request time (sent to last piece): above 1, the constrained side was the faster."""
    lines = [
        "| item | valid | = solo | tokens | tok/s | tok/pass | load penalty | mask share | neighbour tokens | "
        "neighbour tok/s | neighbour tok/pass | neighbour load penalty | tok/s ratio | time ratio |",
        "|" + "---|" * 14,
    ]
    for r in rows:
        ratio = (
            r["tokens_per_second"] / r["neighbour_tokens_per_second"]
            if r["neighbour_tokens_per_second"]
            else float("nan")
        )
        valid = r["valid"] if isinstance(r["valid"], str) else "yes" if r["valid"] else "NO"
        same = ("yes" if r["same_as_solo"] else "NO") + {None: "", True: ", = neighbour", False: ", NOT = neighbour"}[
            r["same_text"]
        ]
        lines.append(
            f"| {r['item']} | {valid} | {same} | {r['tokens']} | {r['tokens_per_second']:.1f} | "
            f"{r['tokens_per_pass']:.2f} | {_over(r['tokens_per_second'], r['solo_tokens_per_second'])} | "
            f"{100 * r['mask_share']:.1f}% | {r['neighbour_tokens']} | {r['neighbour_tokens_per_second']:.1f} | "
            f"{r['neighbour_tokens_per_pass']:.2f} | "
            f"{_over(r['neighbour_tokens_per_second'], r['neighbour_solo_tokens_per_second'])} | {ratio:.2f}x | "
            f"{r['neighbour_seconds'] / r['seconds']:.2f}x |"
        )
    return "\n".join(lines)


def _over(loaded: float, alone: float) -> str:
    return f"{loaded / alone:.2f}" if alone else "n/a"


if __name__ == "__main__":
    main()
