package dynamodbdriver

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"

	"github.com/dlock-dev/dlock/driver"
	"github.com/dlock-dev/dlock/internal/urlparam"
)

// CreateTableInput returns the CreateTable request that Migrate sends: a
// partition key "k" of type string and on-demand capacity
// (PAY_PER_REQUEST), for administrators who create the table themselves
// (with the AWS CLI, CloudFormation or Terraform, the same key schema).
func (d *Driver) CreateTableInput() *dynamodb.CreateTableInput {
	return &dynamodb.CreateTableInput{
		TableName: aws.String(d.table),
		AttributeDefinitions: []types.AttributeDefinition{
			{AttributeName: aws.String(attrKey), AttributeType: types.ScalarAttributeTypeS},
		},
		KeySchema: []types.KeySchemaElement{
			{AttributeName: aws.String(attrKey), KeyType: types.KeyTypeHash},
		},
		BillingMode: types.BillingModePayPerRequest,
	}
}

// createHint is the advice of an error about a missing table.
func (d *Driver) createHint() string {
	return fmt.Sprintf("create it with dynamodbdriver's Migrate, by adding create_table=true to the URL, or with "+
		"aws dynamodb create-table --table-name %s --attribute-definitions AttributeName=k,AttributeType=S "+
		"--key-schema AttributeName=k,KeyType=HASH --billing-mode PAY_PER_REQUEST", d.table)
}

// Migrate creates the lock table when it does not exist and waits until it
// is ACTIVE (seconds on AWS; bound it with ctx), and, with Options.GCAfter
// set, enables the table's TTL on gc_at. It is safe to run concurrently
// and to run again. It returns an error matching driver.ErrInvalidArgument
// when the table exists with another key schema, and a store error when
// DynamoDB cannot be reached or the caller may not create tables.
func (d *Driver) Migrate(ctx context.Context) error {
	if d.closed.Load() {
		return driver.ErrClosed
	}
	_, err := d.api.CreateTable(ctx, d.CreateTableInput())
	var inUse *types.ResourceInUseException
	if err != nil && !errors.As(err, &inUse) {
		return storeErr("migrate: create table "+d.table, err)
	}
	for {
		out, err := d.api.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(d.table)})
		if err != nil {
			return storeErr("migrate: describe table "+d.table, err)
		}
		if err := d.checkSchema(out.Table); err != nil {
			return err
		}
		if out.Table.TableStatus == types.TableStatusActive {
			break
		}
		t := time.NewTimer(250 * time.Millisecond)
		select {
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("dynamodbdriver: migrate: table %s is %s: %w", d.table, out.Table.TableStatus, ctx.Err())
		case <-t.C:
		}
	}
	if d.gcAfter > 0 {
		_, err := d.api.UpdateTimeToLive(ctx, &dynamodb.UpdateTimeToLiveInput{
			TableName: aws.String(d.table),
			TimeToLiveSpecification: &types.TimeToLiveSpecification{
				AttributeName: aws.String(attrGC), Enabled: aws.Bool(true),
			},
		})
		var apiErr smithy.APIError
		if err != nil && !(errors.As(err, &apiErr) && apiErr.ErrorCode() == "ValidationException" &&
			containsFold(apiErr.ErrorMessage(), "already enabled")) {
			return storeErr("migrate: enable TTL on "+attrGC, err)
		}
	}
	return nil
}

// openTimeout bounds Open's DescribeTable: a server that accepts
// connections but never answers is reported unavailable after it, whatever
// the caller's context.
const openTimeout = 10 * time.Second

// checkTable checks that the table exists with the driver's key schema;
// with create, it creates a missing one (Migrate).
func (d *Driver) checkTable(ctx context.Context, create bool) error {
	dctx, cancel := context.WithTimeout(ctx, openTimeout)
	out, err := d.api.DescribeTable(dctx, &dynamodb.DescribeTableInput{TableName: aws.String(d.table)})
	cancel()
	var notFound *types.ResourceNotFoundException
	if errors.As(err, &notFound) {
		if create {
			return d.Migrate(ctx)
		}
		return urlparam.Invalid("dynamodbdriver: table %s does not exist%s: %s", d.table, d.whereSuffix(), d.createHint())
	}
	if err != nil {
		if notDynamoDB(err) {
			return urlparam.Wrap("dynamodbdriver: the endpoint"+d.whereSuffix()+" does not answer as DynamoDB", err)
		}
		err = storeErr("describe table "+d.table, err)
		if !errors.Is(err, driver.ErrInvalidArgument) && ctx.Err() == nil {
			err = fmt.Errorf("%w: %w", driver.ErrUnavailable, err)
		}
		return err
	}
	if out.Table == nil {
		return urlparam.Invalid("dynamodbdriver: the endpoint%s answered DescribeTable %s without a table: it does not answer as DynamoDB", d.whereSuffix(), d.table)
	}
	return d.checkSchema(out.Table)
}

// whereSuffix is " in region R [at ENDPOINT]" for a driver opened by URL,
// else "".
func (d *Driver) whereSuffix() string {
	if d.where == "" {
		return ""
	}
	return " " + d.where
}

// checkSchema refuses a table whose key schema is not one string
// partition key named k.
func (d *Driver) checkSchema(t *types.TableDescription) error {
	if t == nil {
		return fmt.Errorf("dynamodbdriver: DescribeTable of %s returned no table", d.table)
	}
	ok := len(t.KeySchema) == 1 && aws.ToString(t.KeySchema[0].AttributeName) == attrKey &&
		t.KeySchema[0].KeyType == types.KeyTypeHash
	if ok {
		ok = false
		for _, a := range t.AttributeDefinitions {
			if aws.ToString(a.AttributeName) == attrKey && a.AttributeType == types.ScalarAttributeTypeS {
				ok = true
			}
		}
	}
	if !ok {
		var schema []string
		for _, k := range t.KeySchema {
			schema = append(schema, fmt.Sprintf("%s (%s)", aws.ToString(k.AttributeName), k.KeyType))
		}
		return urlparam.Invalid("dynamodbdriver: table %s has key schema %v, not dlock's (a string partition key named k, no sort key): use another table", d.table, schema)
	}
	return nil
}
