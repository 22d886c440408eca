-- The retention in force for each schedule, as its schedulers report it.
-- Released migrations are never edited; add a new file.

-- +goose Up
-- Retention is a setting of each running Scheduler (Config.Retention,
-- Definition.Retention), not part of the stored definition. A scheduler's
-- retention pass writes here the age it applies to the schedule, so that
-- the CLI and the status page show it: microseconds, -1 when every run is
-- kept, NULL while no scheduler has run a pass. A nullable column without a
-- default: the previous release's statements run unchanged beside it.
ALTER TABLE pgclaim_schedules ADD COLUMN IF NOT EXISTS retention_us bigint;

-- +goose Down
ALTER TABLE pgclaim_schedules DROP COLUMN IF EXISTS retention_us;
