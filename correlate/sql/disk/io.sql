-- Module disk.io: requests on the host disk (level 4).
-- INCLUDE block.requests

-- One row per request dispatched on the disk under the host file system;
-- columns as block_requests.
-- @column * as block_requests
CREATE OR REPLACE VIEW disk_io AS
SELECT * FROM block_requests WHERE level = 'disk';
