"""Realistic admin and user phrasings, in pairs: said first, then said later by the same person.

Each pair says what learning must do with the earlier record when the later
phrasing is learned:

- ``SUPERSEDE``: the later one is a new value on the same topic; the earlier is retired.
- ``KEEP``: a different topic (another report, table, server, another part of a
  preference): both stay live.
- ``SAME``: the later one restates the earlier in other words: the earlier stays
  live, worded as it was, and nothing new is written.

Speakers: ``admin`` pairs are an administrator's operational statements (written
as agent_notes); ``user`` pairs are a person's own identity and preferences
(personal memory). A phrasing starting with ``@notes:`` goes through the
directive, as typed; everything else through the builtin classifier.
"""

from __future__ import annotations

from typing import Literal, NamedTuple

Expect = Literal["supersede", "keep", "same"]
SUPERSEDE: Expect = "supersede"
KEEP: Expect = "keep"
SAME: Expect = "same"


class Pair(NamedTuple):
    """Two phrasings of one speaker, ``first`` said an hour before ``later``."""

    speaker: Literal["admin", "user"]
    first: str
    later: str
    expect: Expect
    why: str


CORPUS: tuple[Pair, ...] = (
    # ---- operational: a new value on the same topic supersedes ------------------------------------
    Pair(
        "admin",
        "the daily report uses table example_orders",
        "from now on the daily report uses table example_daily_v2",
        SUPERSEDE,
        "new table for the same report",
    ),
    Pair(
        "admin",
        "@notes: the weekly report uses table weekly_sales",
        "@notes: the weekly report uses table weekly_sales_v2",
        SUPERSEDE,
        "directive, new table",
    ),
    Pair(
        "admin",
        "The report source is example_orders.",
        "The report source is example_archive from now on.",
        SUPERSEDE,
        "the seed's report, new source",
    ),
    Pair(
        "admin",
        "You will produce the monthly report from example_orders",
        "from now on the monthly report is produced from example_monthly",
        SUPERSEDE,
        "you-will, then a rule",
    ),
    Pair(
        "admin",
        "the sales dashboard reads from example_metrics",
        "going forward the sales dashboard reads from example_metrics_v2",
        SUPERSEDE,
        "dashboard source moved",
    ),
    Pair(
        "admin",
        "The staging server is db2.example.internal",
        "the staging server is db3.example.internal",
        SUPERSEDE,
        "staging host moved",
    ),
    Pair(
        "admin",
        "the finance export comes from ledger_main",
        "as of now the finance export comes from ledger_2027",
        SUPERSEDE,
        "export source moved",
    ),
    Pair("admin", "the backup host is 10.0.0.5", "the backup host is 10.0.0.9", SUPERSEDE, "backup host moved"),
    Pair(
        "admin",
        "the example_orders table is refreshed at 06:00",
        "the example_orders table is refreshed at 07:30",
        SUPERSEDE,
        "same table, new time",
    ),
    Pair(
        "admin",
        "always use example_orders, not example_archive",
        "always use example_archive, not example_orders",
        SUPERSEDE,
        "the rule turned around",
    ),
    Pair("admin", "always use example_orders", "never use example_orders", SUPERSEDE, "negated"),
    Pair(
        "admin",
        "from now on use example_archive instead of example_orders",
        "from now on use example_warehouse instead of example_archive",
        SUPERSEDE,
        "instead of the last value",
    ),
    Pair("admin", "the daily report = example_orders", "the daily report = example_orders_eu", SUPERSEDE, "terse form"),
    Pair(
        "admin",
        "@notes: the daily report uses table example_orders",
        "from now on use example_archive instead of example_orders",
        SUPERSEDE,
        "names the old value",
    ),
    # ---- operational: another topic is kept ---------------------------------------------------------
    Pair(
        "admin",
        "@notes: the daily report uses table example_orders",
        "@notes: the weekly report uses table weekly_sales",
        KEEP,
        "daily vs weekly (the issue's case)",
    ),
    Pair(
        "admin",
        "the daily report uses table example_orders",
        "the weekly report uses table weekly_sales",
        KEEP,
        "daily vs weekly, extracted",
    ),
    Pair(
        "admin",
        "the sales dashboard uses example_metrics",
        "the ops dashboard uses example_ops_metrics",
        KEEP,
        "which dashboard",
    ),
    Pair(
        "admin",
        "the staging server is db2.example.internal",
        "the production server is db1.example.internal",
        KEEP,
        "which server",
    ),
    Pair(
        "admin",
        "the example_orders table is refreshed at 06:00",
        "the example_archive table is refreshed at 02:00",
        KEEP,
        "which table",
    ),
    Pair(
        "admin",
        "the daily report uses table example_orders",
        "the daily dashboard uses table example_metrics",
        KEEP,
        "report vs dashboard",
    ),
    Pair(
        "admin",
        "You will produce the monthly report from example_orders",
        "You will produce the quarterly report from example_quarterly",
        KEEP,
        "monthly vs quarterly",
    ),
    Pair(
        "admin",
        "the finance export comes from ledger_main",
        "the payroll export comes from payroll_main",
        KEEP,
        "which export",
    ),
    Pair("admin", "the backup host is 10.0.0.5", "the build host is 10.0.0.7", KEEP, "which host"),
    Pair(
        "admin",
        "the daily report uses table example_orders",
        "produce the daily report",
        KEEP,
        "a request is not memory",
    ),
    Pair(
        "admin",
        "from now on the daily report uses table example_orders",
        "always send the daily report to finance@example.com",
        KEEP,
        "where it goes is not where it comes from",
    ),
    Pair(
        "admin",
        "the sales forecast comes from forecast_sales",
        "the sales report comes from report_sales",
        KEEP,
        "forecast vs report",
    ),
    # ---- operational: a paraphrase retires nothing ------------------------------------------------
    Pair(
        "admin",
        "@notes: the daily report uses table example_orders",
        "from now on the daily report is produced from example_orders",
        SAME,
        "the issue's @notes vs paraphrase",
    ),
    Pair(
        "admin",
        "@notes: the weekly report uses table weekly_sales",
        "the weekly report comes from weekly_sales",
        SAME,
        "paraphrase of a directive",
    ),
    Pair(
        "admin",
        "The staging server is db2.example.internal",
        "our staging server is db2.example.internal",
        SAME,
        "same host",
    ),
    Pair(
        "admin",
        "the sales dashboard reads from example_metrics",
        "going forward the sales dashboard uses example_metrics",
        SAME,
        "reads from vs uses",
    ),
    # ---- personal: a new value supersedes ----------------------------------------------------------
    Pair("user", "answer me in English", "answer me in French", SUPERSEDE, "new language"),
    Pair("user", "reply in German", "please answer me only in Spanish", SUPERSEDE, "new language, other words"),
    Pair("user", "I prefer short answers", "I prefer detailed answers", SUPERSEDE, "new length"),
    Pair("user", "be brief", "be detailed", SUPERSEDE, "new style"),
    Pair("user", "my name is Bob", "my name is Robert", SUPERSEDE, "new name"),
    Pair("user", "please call me Bobby", "call me Rob", SUPERSEDE, "new form of address"),
    Pair("user", "My timezone is CET", "my timezone is PST", SUPERSEDE, "moved timezone"),
    Pair("user", "I'm based in Lyon", "I am based in Paris", SUPERSEDE, "moved city"),
    Pair("user", "I work in finance", "I work in marketing", SUPERSEDE, "new team"),
    Pair(
        "user",
        "answer me in English, and keep it short",
        "answer me in French, and keep it short",
        SUPERSEDE,
        "a two-part preference restated with a new part",
    ),
    # ---- personal: another topic, or another part, is kept ----------------------------------------
    Pair(
        "user",
        "answer me in English, and keep it short",
        "I prefer answers in English",
        KEEP,
        "a two-part preference stays whole (the issue's case)",
    ),
    Pair("user", "answer me in English", "I prefer short answers", KEEP, "language vs length"),
    Pair("user", "I prefer short answers", "I prefer answers in English", KEEP, "length vs language"),
    Pair("user", "my name is Bob", "call me Bobby", KEEP, "name vs form of address"),
    Pair("user", "I work in finance", "I'm based in Lyon", KEEP, "work vs place"),
    Pair("user", "My timezone is CET", "my team is platform", KEEP, "timezone vs team"),
    # ---- personal: a paraphrase retires nothing -----------------------------------------------------
    Pair("user", "answer me in English", "I prefer answers in English", SAME, "the same wish, other words"),
)
