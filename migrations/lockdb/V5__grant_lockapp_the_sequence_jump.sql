-- lock-server jumps fencing_token_seq before any grant on a lockdb history it cannot vouch for (its
-- own start, a promotion, a restore, a restarted postmaster): setval needs UPDATE on the sequence,
-- which V2 did not give. The jump only ever moves the sequence up (docs/design.md, "Never a reused
-- token"); lockapp already draws every token with nextval.
GRANT UPDATE ON SEQUENCE fencing_token_seq TO lockapp;
