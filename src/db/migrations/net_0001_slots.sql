CREATE TABLE `net_slots` (
	`idx` integer PRIMARY KEY NOT NULL,
	`netns` text NOT NULL,
	`state` text NOT NULL,
	`sandbox_id` text,
	`policy` text,
	`updated_at` integer NOT NULL
);
--> statement-breakpoint
CREATE UNIQUE INDEX `net_slots_sandbox_id_unique` ON `net_slots` (`sandbox_id`);