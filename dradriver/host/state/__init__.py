"""The node's claim state: the ledger of device holds and the claim transaction over it.

* :mod:`.schema` — the ledger's wire schema (entries, holds, holders) and its errors;
* :mod:`.codec` — the file on disk: read, verify, migrate, checksum, quarantine;
* :mod:`.holds` — the conflict index (who uses which device);
* :mod:`.ledger` — :class:`~.ledger.Ledger`, every change durable before it returns;
* :mod:`.commits` — the group committer (concurrent changes share one fsynced write);
* :mod:`.claimstore` — :class:`~.claimstore.ClaimStore`, one prepare and one unprepare
  of a claim as one transaction (hooks, CDI spec, ledger entry, side files).

Everything here is reusable by a Python DRA driver for other hardware.
"""
