DROP TABLE IF EXISTS tokenguard_timelines;
