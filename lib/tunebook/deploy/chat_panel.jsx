// The side panel of `python -m tunebook.chat`: the server's own state, from its /metrics.
// Chainlit renders it as a CustomElement; `props` come from tunebook.deploy.chat.panel_props.
// A model with dummy weights gets a banner on top: its replies are random text by design.
export default function ServerState() {
  const rows = props.rows || [];
  const bad = props.status !== "ok";
  return (
    <div className="tunebook-server-state flex flex-col gap-2 text-sm" data-status={props.status}>
      {props.notice ? (
        <div
          className="tunebook-dummy-weights"
          role="status"
          style={{
            background: "#fff8c5",
            color: "#3b2300",
            border: "1px solid #d4a72c",
            borderRadius: "6px",
            padding: "6px 8px",
          }}
        >
          {props.notice}
        </div>
      ) : null}
      <div className="text-muted-foreground">
        <div className="tunebook-server-url">{props.server}</div>
        {props.model ? <div className="tunebook-server-model">model: {props.model}</div> : null}
        {props.label && props.label !== props.server ? <div>{props.label}</div> : null}
      </div>
      {props.message ? (
        <div className="tunebook-server-message" style={{ color: bad ? "#c0392b" : undefined }}>
          {props.message}
        </div>
      ) : null}
      <table style={{ width: "100%", borderCollapse: "collapse" }}>
        <tbody>
          {rows.map((r) => (
            <tr key={r.key} data-metric={r.key}>
              <td className="text-muted-foreground" style={{ padding: "2px 12px 2px 0" }}>
                {r.label}
              </td>
              <td className="font-mono" style={{ textAlign: "right", whiteSpace: "nowrap" }}>
                {r.value}
              </td>
            </tr>
          ))}
        </tbody>
      </table>
      <div className="tunebook-max-tokens text-muted-foreground" style={{ fontSize: "0.75em" }}>
        reply cap at start: {props.max_tokens ? `${props.max_tokens} tokens` : "none"} (settings
        change it)
      </div>
      <div className="tunebook-server-updated text-muted-foreground" style={{ fontSize: "0.75em" }}>
        updated {props.updated}
      </div>
    </div>
  );
}
