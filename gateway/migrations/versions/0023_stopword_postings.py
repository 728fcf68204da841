"""the term index holds no stopword: delete the postings of a plural whose singular is one ("uses" as "use")

Revision ID: 0023_stopword_postings
Revises: 0022_terms_review_by
"""

import sqlalchemy as sa
from alembic import op

revision = "0023_stopword_postings"
down_revision = "0022_terms_review_by"
branch_labels = None
depends_on = None

# memory.words.terms left out a stopword before dropping a plural's "s", so "uses" was indexed as
# "use", "makes" as "make", "others" as "other": words in a large share of an organisation's notes.
# A query never asks for a stopword, so no turn read those postings, but every note written kept
# them and every write and retirement wrote them. terms() now leaves them out; these are the ones
# already written. The words are the stopwords of that day (memory/words.py), written out here so
# the migration does what it did whatever the list becomes.
_STOPWORDS = """
    a about after again all also am an and any are as at be been before being both but by can could did do
    does doing done for from had has have having he her here hers him his how i if in into is it its itself
    just me more most my myself no nor not now of off on once only or other our ours out over own please
    same she should so some such than that the their theirs them then there these they this those through
    to too under until up very was we were what when where which while who whom why will with would you
    your yours yourself let lets get got make made use used using want wants tell told say said ok okay
    hi hello hey thanks thank yes yeah sure one
""".split()


def upgrade() -> None:
    terms = sa.table("memory_terms", sa.column("term", sa.String))
    op.execute(terms.delete().where(terms.c.term.in_(_STOPWORDS)))


def downgrade() -> None:
    # Nothing to put back: the code before this revision reads the index the same without them
    # (it never asks for a stopword), and its next write of such a note indexes the word again.
    pass
