"""What rank 0 shows: a live bar on a terminal, log lines elsewhere."""
import io
import logging

from galapagos.progress import ProgressView, Snapshot, line


def snap(**kw):
    base = dict(done=12, total=40, best=0.8734, busy=3, workers=4, failures=1, elapsed=95.0, remaining=None)
    return Snapshot(**{**base, **kw})


def test_line_says_what_a_user_wants():
    text = line(snap())
    for words in ("evals 12/40", "best 0.8734", "busy 3/4", "failed 1", "1:35 elapsed", "left"):
        assert words in text
    assert "2:00 left" in line(snap(total=None, remaining=120.0))
    assert "best -" in line(snap(best=None, done=0))


def test_live_bar_redraws_one_line():
    out = io.StringIO()
    view = ProgressView(out, live=True)
    view.show(snap())
    view.show(snap(done=20))
    text = out.getvalue()
    assert text.count("\r") == 2 and "\n" not in text
    assert "[#####" in text and "evals 20/40" in text


def test_plain_lines_when_not_a_terminal(caplog):
    view = ProgressView(io.StringIO(), live=False, every=3600)
    with caplog.at_level(logging.INFO, logger="galapagos"):
        view.show(snap(), force=True)
        view.show(snap(done=13))  # not forced, within `every`: no new line
        view.show(snap(done=14), force=True)
    assert [r.getMessage().split(" |")[0] for r in caplog.records] == ["evals 12/40", "evals 14/40"]
