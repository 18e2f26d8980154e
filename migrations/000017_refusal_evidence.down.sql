DROP TABLE IF EXISTS tokenguard_refusal_evidence;
