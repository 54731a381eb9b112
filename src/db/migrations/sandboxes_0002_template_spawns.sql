CREATE TABLE `template_spawns` (
	`template_id` text PRIMARY KEY NOT NULL,
	`spawn_count` integer NOT NULL,
	`last_spawned_at` integer NOT NULL
);
