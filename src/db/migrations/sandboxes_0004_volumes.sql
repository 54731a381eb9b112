ALTER TABLE `sandboxes` ADD `volume_mounts` text DEFAULT '[]' NOT NULL;--> statement-breakpoint
CREATE TABLE `volumes` (
	`id` text PRIMARY KEY NOT NULL,
	`name` text NOT NULL,
	`token` text NOT NULL,
	`size_bytes` integer NOT NULL,
	`created_at` integer NOT NULL
);
--> statement-breakpoint
CREATE UNIQUE INDEX `volumes_name_unique` ON `volumes` (`name`);
