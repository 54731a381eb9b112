ALTER TABLE `node_reports` ADD `left_at` integer;
