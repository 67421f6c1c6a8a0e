package cli

import (
	"context"
	"time"

	"github.com/spf13/cobra"
)

// completeTimeout bounds the store round trip of a shell completion: a tab
// press must not hang on a store that is down.
const completeTimeout = 2 * time.Second

// completeKeys completes the argument at position pos with the held keys
// that start with what was typed, from the store's List, where the store
// can list (dlockd, Redis, etcd, ZooKeeper, PostgreSQL); elsewhere, or when
// the store cannot be reached within 2s, it offers nothing. Keys with
// control or format characters are left out. Install the
// completion script with "dlock completion bash|zsh|fish|powershell".
func completeKeys(g *globals, pos int) cobra.CompletionFunc {
	return func(cmd *cobra.Command, args []string, toComplete string) ([]cobra.Completion, cobra.ShellCompDirective) {
		if len(args) != pos {
			return nil, cobra.ShellCompDirectiveDefault // the command after --: files
		}
		if err := applyConfig(cmd, g); err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		ctx, cancel := context.WithTimeout(context.Background(), completeTimeout)
		defer cancel()
		if g.checkStore() != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		l, err := g.open(ctx)
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		defer l.Close()
		infos, err := l.List(ctx, toComplete)
		if err != nil {
			return nil, cobra.ShellCompDirectiveNoFileComp
		}
		out := make([]cobra.Completion, 0, len(infos))
		for _, h := range infos {
			// A key with a control or format character cannot be offered
			// raw (a newline splits it, a tab is cobra's description
			// separator, an escape reaches the terminal) nor quoted (the
			// shell would insert the quotes): it is skipped.
			if needsQuote(h.Key) {
				continue
			}
			out = append(out, cobra.CompletionWithDesc(h.Key, quoteIfControl(h.Holder)))
		}
		return out, cobra.ShellCompDirectiveNoFileComp
	}
}
