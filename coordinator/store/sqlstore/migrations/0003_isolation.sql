-- Isolation levels (docs/isolation.md): the level a job asks for, and a
-- project's minimum. Empty means none was named. Same portable rules as
-- 0001.

ALTER TABLE jobs ADD COLUMN isolation TEXT NOT NULL DEFAULT '';
ALTER TABLE projects ADD COLUMN min_isolation TEXT NOT NULL DEFAULT '';
