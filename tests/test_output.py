import io

from mpinb.notebook.cell.output import RankPrinter, rank_ordered


def test_lines_are_labelled_and_partial_lines_wait_for_their_newline():
    out, err = io.StringIO(), io.StringIO()
    printer = RankPrinter(stdout=out, stderr=err)
    printer.feed(1, "stdout", "hel")
    assert out.getvalue() == ""
    printer.feed(0, "stdout", "a\nb\n")
    printer.feed(1, "stdout", "lo\nwor")
    printer.feed(2, "stderr", "oops\n")
    printer.finish()
    assert out.getvalue() == "[rank 0] a\n[rank 0] b\n[rank 1] hello\n[rank 1] wor\n"
    assert err.getvalue() == "[rank 2] oops\n"


def test_rank_ordered_view():
    text = rank_ordered({1: "x\n", 0: "y\n"}, {1: "warn\n"}, ranks=[0, 1])
    assert text == "--- rank 0 ---\ny\n--- rank 1 ---\nx\n(stderr) warn"
