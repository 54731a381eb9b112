CREATE TABLE `bindings` (
	`sandbox_id` text PRIMARY KEY NOT NULL,
	`node_id` text NOT NULL,
	`endpoint` text NOT NULL,
	`updated_at` integer NOT NULL
);
--> statement-breakpoint
CREATE INDEX `bindings_node_idx` ON `bindings` (`node_id`);--> statement-breakpoint
CREATE TABLE `node_reports` (
	`node_id` text PRIMARY KEY NOT NULL,
	`node` text NOT NULL,
	`p2p` text,
	`last_seen` integer NOT NULL
);
