"""Plain-text rendering of ``coevo audit``'s answers (``--json`` prints the Structs instead)."""

from __future__ import annotations

from collections.abc import Sequence

from agents.audit.answers import Lineage, TipAudit, Use
from agents.audit.credit import CreditAudit
from agents.audit.episode import EpisodeAudit, Shown, Turn
from agents.audit.shown import number_text as _f  # (short: most rows show several)
from agents.audit.shown import purpose_text, score_text, unused_text, update_text

MAX_ROWS = 50
"""Most rows of a table in text (retrievals, credits); ``--json`` has them all."""


def _q(text: str, width: int = 90) -> str:
    """``text`` quoted on one line, cut at ``width``: its line breaks, tabs and carriage
    returns written as escapes, as ``--json`` holds them (they collapsed into spaces, so
    ``wait\\r`` read ``'wait '`` and an extractor's two lines read as one)."""
    return repr(text if len(text) <= width else text[: width - 3] + "...")


def _entry_pending(n: int, counterfactual: bool) -> str:
    """What an entry's re-derived credits past its recorded ones are, as the checks say it."""
    more = f"{n} more than the log holds" if counterfactual else f"{n} not recorded yet"
    return f"  ({more}: not in the recorded sum)"


def _not_applied(end: str) -> str:
    """An update not applied, in a run whose last session ended ``end`` ("": it is running,
    or was killed)."""
    return f"(not applied: the run {end} before it)" if end else "(not applied yet)"


def render_tip(a: TipAudit) -> list[str]:
    """The lines of a tip audit."""
    o = a.origin
    where = (
        f"evicted at seq {a.evicted_seq} ({a.evicted})"
        if a.evicted_seq is not None
        else "in the bank"
    )
    if a.evicted_by:
        where += f" by extractor call {a.evicted_by}"
    if a.evicted_into:
        where += (
            f", whose result was refused as a duplicate of entry "
            f"{', '.join(map(str, a.evicted_into))} (it lives on there)"
        )
    out = [f"entry {a.tip} in {a.slot}: {_q(a.text)}", f"  stored at seq {a.stored_seq}; {where}"]
    if o.kind == "extractor":
        src = f"{o.task} of {', '.join(o.episodes)}" if o.episodes else o.task or "?"
        if o.episodes and o.episode_success is not None:
            won = "success" if o.episode_success else "failure"
            src += f" ({won}, score {score_text(o.episode_score)}"
            src += f"; it used entry {o.entry_used})" if o.entry_used >= 0 else "; free)"
        if o.merge_step >= 0:
            src += f" step {o.merge_step} of entries {list(o.entries)}"
        out.append(
            f"  written by extractor call {o.call} at seq {o.seq} ({src}), extractor v"
            f"{o.extractor_version}, op {o.op or '?'} of {o.ops}"
        )
        if o.errors:
            out.append(f"    parser: {'; '.join(o.errors)}")
        out.append(f"    response: {_q(o.response)}")
    elif o.kind == "actor":
        out.append(
            f"  stored by actor {o.source!r} at seq {o.seq}, handling seq {o.request_seq} "
            "(no extractor call or reflection wrote it)"
        )
    else:
        out.append(
            f"  written by the policy's reflection on {o.source} at seq {o.seq} (policy v"
            f"{o.policy_version}, episode score {_f(o.episode_score, 2)})"
        )
    out.append("  lineage:")
    out += _lineage(a.lineage, "    ")
    if a.children:
        out.append(f"  replaced by (update / merge): {', '.join(map(str, a.children))}")
    if a.duplicates:
        out.append(f"  later proposals refused as duplicates: {', '.join(a.duplicates)}")
    lost = sum(u.abandoned for u in a.uses)
    out.append(
        f"  retrieved {len(a.uses)} time{'s' * (len(a.uses) != 1)} in {a.guided} "
        f"episode{'s' * (a.guided != 1)} ({a.guided_success} succeeded)"
        + _by_purpose(a.uses)
        + (f"; {lost} of them in attempts later abandoned" if lost else "")
    )
    if a.uses:
        # a re-ranking score exists for the "diverse" rule only (EMPO2's shows none)
        reranked = any(u.score is not None for u in a.uses)
        out.append(
            "    seq      episode    turn pos rank  similarity  "
            + ("re-rank  " if reranked else "")
            + "outcome"
        )
        for u in a.uses[:MAX_ROWS]:
            end = (
                "abandoned (the episode ran again)"
                if u.abandoned
                else "running"
                if not u.ended
                else f"aborted: {u.aborted}"
                if u.aborted
                else f"{'success' if u.success else 'failure'} {score_text(u.outcome_score)} "
                f"({u.purpose})"
            )
            flag = "" if u.alive else "  NOT IN THE BANK AT THAT SEQ"
            out.append(
                f"    {u.seq:<8} {u.episode:<10} {u.turn:>4} {u.position:>3} {u.rank:>4}  "
                f"{u.similarity:>10.3f}  "
                + (f"{_f(u.score, 2):>7}  " if reranked else "")
                + f"{end}{flag}"
            )
        out += _more(len(a.uses))
    out.append(f"  credits: {len(a.credits)}, sum {a.credit_sum:+g}")
    if a.credits:
        out.append(
            "    seq      episode    call       outcome          rule           credit  update"
        )
        for c in a.credits[:MAX_ROWS]:
            res = f"{'success' if c.success else 'failure'} {_f(c.episode_score, 2)}"
            upd = str(c.update) if c.update >= 0 else unused_text(a.run_end)
            out.append(
                f"    {c.seq:<8} {c.episode:<10} {c.call:<10} {res:<16} {c.rule:<14} "
                f"{_f(c.credit, 3, 6)}  {upd}"
            )
        out += _more(len(a.credits))
    for s in a.updates:
        done = (
            f"-> extractor v{s.version}, {s.samples} samples, loss {_f(s.loss, 4, sign='')}"
            if s.version >= 0
            else _not_applied(a.run_end)
        )
        out.append(
            f"  extractor update {s.update} (request seq {s.request_seq}, {s.batch} calls): call "
            f"{s.call} reward {_f(s.reward)}, advantage {_f(s.advantage)}, weight "
            f"{s.weight:.3f} {done}"
        )
    return out


def _lineage(node: Lineage, indent: str) -> list[str]:
    gone = f" [evicted: {node.evicted}]" if node.evicted else ""
    who = node.call or (f"reflection on {node.source}" if node.source else "its actor")
    src = f" (from {node.source})" if node.source else ""
    lines = [f"{indent}{node.tip} by {who}{src}{gone}: {_q(node.text, 60)}"]
    for parent in node.parents:
        lines += _lineage(parent, indent + "  <- ")
    return lines


def _more(n: int) -> list[str]:
    return [f"    ... {n - MAX_ROWS} more (--json has them all)"] if n > MAX_ROWS else []


def render_episode(a: EpisodeAudit) -> list[str]:
    """The lines of an episode audit."""
    out = [
        f"episode {a.episode}: {a.family} variant {a.variant}, {purpose_text(a.purpose, a.scope)}, "
        f"rollout {a.rollout}, {a.worker}",
        f"  goal: {a.goal}",
    ]
    if a.abandoned:
        out.append(
            f"  its last attempt: {a.abandoned} earlier one{'s' if a.abandoned > 1 else ''} "
            "abandoned (a resumed run or a restarted worker ran it again; `coevo log RUN "
            f"--episode {a.episode}` shows every attempt)"
        )
    for t in a.turns:
        out += _turn(t)
    if a.ended == "finished":
        out.append(
            f"  ended: {'success' if a.success else 'failure'}, score {_f(a.score, sign='')}, "
            f"{a.steps} steps, total reward {_f(a.total_reward)}"
        )
    elif a.ended == "running":
        out.append("  ended: not yet in the log (running, or the run stopped before it ended)")
    else:
        out.append(f"  ended: {a.ended}")
    if a.advantage is not None:
        v = a.advantage
        out.append(
            f"  reward: outcome {_f(v.outcome, 4, sign='')} + {v.intrinsic_coef:g} x intrinsic "
            f"{_f(v.intrinsic, 4, sign='')} = {_f(v.reward, 4, sign='')} (group {v.group}: "
            f"[{', '.join(_f(r, 4, sign='') for r in v.group_rewards)}])"
        )
        warmup = f", {update_text(v.update)}" if v.update < 0 else ""
        out.append(
            f"  advantage: {_f(v.advantage, 6)} for each of its {len(a.turns)} samples (rule "
            f"{v.rule}, rollout {v.rollout}, seq {v.seq}{warmup})"
        )
    elif a.purpose != "train":
        out.append("  advantage: none (an evaluation episode: updates train on training ones)")
    elif a.ended == "running":
        out.append("  advantage: none (the episode has not ended)")
    elif a.ended != "finished":  # its group's advantages are over the episodes that finished
        out.append("  advantage: none (it aborted: an update trains on finished episodes only)")
    else:
        out.append("  advantage: none (not a trained episode, or its group has not ended)")
    if a.update is not None:
        u = a.update
        done = (
            f"-> policy v{u.version} ({u.samples} samples, {u.stale} stale, loss {_f(u.loss, 4)}, "
            f"kl {_f(u.kl, 4, sign='')}, digest {u.digest[:12]})"
            if u.version >= 0
            else _not_applied(a.run_end)
        )
        out.append(
            f"  update {u.update} (gradient request seq {u.seq}, advantage {_f(u.advantage, 6)}) "
            + done
        )
    if a.credit is not None:
        c = a.credit
        line = f"  credit: entry {c.entry} (call {c.call}) {_f(c.credit)} ({c.rule}, seq {c.seq})"
        if c.update >= 0:
            line += (
                f" -> extractor update {c.update}: reward {_f(c.reward)}, advantage "
                f"{_f(c.advantage)}, weight {c.weight:.3f}"
                + (f" -> extractor v{c.version}" if c.version >= 0 else "")
            )
        out.append(line)
    for w in a.written:
        what = f"extractor call {w.call}" if w.kind == "extractor" else "reflection"
        ops = f" ops [{', '.join(w.ops)}]" if w.ops else ""
        out.append(
            f"  wrote: {what} (seq {w.seq}){ops}: {_q(w.text, 60)} -> stored {list(w.stored)}"
            + (f", refused {list(w.refused)}" if w.refused else "")
        )
    return out


def _writer(s: Shown) -> str:
    """What wrote a retrieved entry, as :func:`render_tip` says it."""
    if s.call:
        return s.call
    return f"stored by actor {s.stored_by!r}" if s.stored_by else "written by a reflection"


def _turn(t: Turn) -> list[str]:
    out = [
        f"  turn {t.turn} (seq {t.seq}, "
        + (f"policy v{t.policy_version})" if t.policy_version >= 0 else "no policy: scripted)"),
        f"    obs: {_q(t.observation, 110)}",
    ]
    out.append(f"    admissible: {' | '.join(t.admissible)}")
    for s in t.retrieved:
        out.append(
            f"    retrieved entry {s.tip} ({_writer(s)}; rank {s.rank}, "
            f"similarity {s.similarity:.3f}"
            + (f", re-ranking score {_f(s.score, 2)}" if s.score is not None else "")
            + f"): {_q(s.text, 60)}"
        )
    if t.searched >= 0 and not t.retrieved:
        out.append(
            "    retrieved nothing: the memory slot was empty"
            if t.searched == 0
            else f"    retrieved nothing: none of the slot's {t.searched} entries was similar "
            "enough"
        )
    if t.tips_shown and not t.retrieved:
        out.append(f"    {t.tips_shown} entries shown (retrieved at an earlier turn)")
    if t.prompt_cut:
        out.append(
            f"    prompt cut: {t.prompt_cut} tokens from its middle to fit the model (what "
            "stood there, entries shown included, was not seen)"
        )
    valid = "" if t.valid else " (not admissible)"
    answer = (
        f"reward {t.reward:+g}, score {_f(t.score, sign='')}{', done' if t.done else ''}"
        if t.answered
        else "no step recorded (the run stopped, or the world failed, before it)"
    )
    out.append(f"    action: {t.action}{valid}  logp {_f(t.logp, 4)}  -> {answer}")
    return out


def render_credit(a: CreditAudit, top: int) -> list[str]:
    """The lines of a credit audit; ``top`` rows of the per-entry and per-call tables."""
    adv = "with the run's std_norm" if a.std_norm is None else f"std_norm={a.std_norm}"
    head = "counterfactual" if a.counterfactual else "re-derived with the run's settings"
    nothing = (
        f"no extractor credit up to seq {a.events - 1}"
        if a.partial
        else "no extractor credit in this run"
    )
    credit = (
        f"rule {a.rule}, batch {a.batch}, alpha {a.alpha:g}, cooldown {a.cooldown}, "
        f"counts {a.counts}"
        if a.credited
        else nothing
    )
    subgroups = a.split is not None  # a method with guided and free episodes
    split = f", split={a.split}, weighted={a.weighted}" if subgroups else ""
    out = [f"credit {head}, from {a.events} events: {credit}; advantages {adv}{split}"]
    for c in a.checks:
        formula = "formula" if c.kind in ("advantages_computed", "gradient_requested") else "rule"
        same = "equal" if c.names_compared else f"the same but for the {formula}'s name"
        line = (
            f"  {c.kind:<30} {c.recorded:>6} recorded {c.derived:>6} re-derived {c.equal:>6} {same}"
        )
        if c.pending:  # a live run's credit actor has not recorded them, or a counterfactual's
            line += (
                f", {c.pending} more than the log holds"
                if a.counterfactual
                else f", {c.pending} not recorded yet"
            )
        out.append(line)
        m = c.first_mismatch
        if m is not None and not a.counterfactual:
            out.append(f"    first difference at seq {m.seq}: {', '.join(m.fields) or 'missing'}")
            out.append(f"      recorded:   {m.recorded[:200]}")
            out.append(f"      re-derived: {m.derived[:200]}")
    if not a.counterfactual:
        out.append(
            "  result: "
            + ("every credit and advantage matches the log" if a.match else "DIFFERS from the log")
        )
    out.append(
        f"  credits changed: {a.credits_changed} (sign flips {a.credit_sign_flips}); extractor "
        f"updates {a.requests[0]} -> {a.requests[1]}; calls whose push changes sign: "
        f"{a.calls_flipped} of {len(a.calls)}"
    )
    out.append(
        f"  episodes whose advantage changes: {a.samples_changed} of the {a.samples} an update "
        f"trained on (sign flips {a.sample_sign_flips})"
    )
    if a.guided_advantage is not None and a.free_advantage is not None:
        g, f = a.guided_advantage, a.free_advantage
        out.append(
            f"  mean advantage guided {_f(g[0], 4)} -> {_f(g[1], 4)}, free {_f(f[0], 4)} -> "
            f"{_f(f[1], 4)}"
        )
    if a.entries and top:
        out.append(
            f"  entries (top {top} by change of their credit sum): tip credits recorded -> "
            "re-derived"
        )
        out += [
            f"    {e.tip:>6} {e.credits:>5} {_f(e.recorded, 3, 9)} -> {_f(e.derived, 3, 9)}"
            + (_entry_pending(e.pending, a.counterfactual) if e.pending else "")
            for e in a.entries[:top]
        ]
    if a.calls and top:
        out.append(
            f"  extractor calls (top {top} by change of push = sum of advantage x weight): call, "
            "credits (all), r(m) as its last update read it, push, updates; recorded -> "
            "re-derived"
        )
        out += [
            f"    {x.call:<10} {x.credits:>4}  {_f(x.recorded_reward)} -> {_f(x.derived_reward)}  "
            f"{_f(x.recorded_push, 4)} -> {_f(x.derived_push, 4)}  "
            f"{x.recorded_updates} -> {x.derived_updates}"
            for x in a.calls[:top]
        ]
    if a.entry is not None:
        sums = next((e for e in a.entries if e.tip == a.entry), None)
        out.append(
            f"  entry {a.entry}: {len(a.entry_credits)} credited "
            f"episode{'s' * (len(a.entry_credits) != 1)}, sum "
            f"{_f(sums and sums.recorded, 3)} -> {_f(sums and sums.derived, 3)}; per episode: "
            "episode, outcome, credit (the extractor update it goes to; 'not made': the run "
            "ended, or has not yet come, before it) recorded -> re-derived"
        )
        out += [
            f"    {c.episode:<12} {'success' if c.success else 'failure':<8} "
            f"{_credit(c.recorded, c.recorded_step, c.recorded_made)} -> "
            f"{_credit(c.derived, c.derived_step, c.derived_made)}"
            for c in a.entry_credits
        ]
    return out


def _credit(value: float | None, step: int | None, made: bool) -> str:
    if value is None:
        return "none"
    return f"{_f(value, 3)} ({step}{'' if made else ', not made'})"


def _by_purpose(uses: Sequence[Use]) -> str:
    """The episodes an entry was shown in, by purpose, when there is more than one (training
    and evaluation episodes' successes summed read as one success rate): ``: train 10 (1
    succeeded), eval 14 (2 succeeded)``."""
    episodes = {u.episode: u for u in uses if not u.abandoned}
    purposes = sorted({u.purpose for u in episodes.values()}, key=lambda p: (p != "train", p))
    if len(purposes) < 2:
        return ""
    parts = []
    for p in purposes:
        mine = [u for u in episodes.values() if u.purpose == p]
        won = sum(1 for u in mine if u.ended and u.success)
        parts.append(f"{p or '?'} {len(mine)} ({won} succeeded)")
    return ": " + ", ".join(parts)
