-- The cdc profile's sample table (run once by the postgres image on a fresh volume).
CREATE TABLE IF NOT EXISTS articles (
  id     int PRIMARY KEY,
  title  text,
  body   text,
  status text
);
