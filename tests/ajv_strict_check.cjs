// Compile every exported JSON Schema with ajv in strict mode (draft 2020-12, ajv-formats) and
// validate instances with it. Usage: node ajv_strict_check.cjs SCHEMA_DIR INSTANCES_JSON
// INSTANCES_JSON: {"<Name>": [instance, ...]}. Prints {"<Name>": {"error": null | "...", "valid": [bool, ...]}}.
const fs = require("fs");
const path = require("path");
const Ajv2020 = require("ajv/dist/2020");
const addFormats = require("ajv-formats");

const [schemaDir, instancesFile] = process.argv.slice(2);
const instances = JSON.parse(fs.readFileSync(instancesFile, "utf8"));
const out = {};
for (const file of fs.readdirSync(schemaDir).filter((f) => f.endsWith(".schema.json")).sort()) {
  const name = file.slice(0, -".schema.json".length);
  const ajv = new Ajv2020({ strict: true, allErrors: true });
  addFormats(ajv);
  try {
    const validate = ajv.compile(JSON.parse(fs.readFileSync(path.join(schemaDir, file), "utf8")));
    out[name] = { error: null, valid: (instances[name] || []).map((x) => validate(x)) };
  } catch (err) {
    out[name] = { error: String(err && err.message ? err.message : err), valid: [] };
  }
}
process.stdout.write(JSON.stringify(out));
