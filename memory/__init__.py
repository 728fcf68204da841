"""Memory: records, extraction, the RBAC write gate, revisions, relearn, consolidation, rendering.

Depends on pairing's Principal/Role only.
"""
